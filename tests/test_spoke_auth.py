"""A spoke enforces its hub's tokens and roles, for data it has cached, with the hub up and down."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator

import pytest

from tests.hubserver import unique_name
from tests.spokeserver import (
    RestartableHub,
    Spoke,
    random_bytes,
    start_restartable_hub,
    start_spoke,
)

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def setup(tmp_path) -> Iterator[tuple[RestartableHub, Spoke, dict]]:
    with start_restartable_hub(tmp_path / "hub") as hub:
        plane = hub.plane()
        info: dict = {"a": unique_name("a"), "b": unique_name("b")}
        for name in ("a", "b"):
            repo = info[name]
            plane.create_repo(repo)
            data = random_bytes(400_000, hash(name) % 1000)
            plane.put_object(repo, "main", "secret.bin", io.BytesIO(data))
            info[f"{name}_data"] = data
            info[f"{name}_commit"] = plane.commit(repo, "main", "data").id
        info["token_a"] = plane.create_token("reader-of-a", roles={info["a"]: "read"})[
            "token"
        ]
        info["token_b_unused"] = plane.create_token(
            "reader-of-b", roles={info["b"]: "read"}
        )["token"]
        with start_spoke(
            hub.url, tmp_path / "cache", "256MiB", token=hub.token, lease=1.0
        ) as spoke:
            # Someone allowed to (the admin) has read both repositories through the spoke: all cached.
            with spoke.client() as c:
                for name in ("a", "b"):
                    for ref in ("main", info[f"{name}_commit"]):
                        r = c.get(
                            f"/api/v1/repos/{info[name]}/refs/{ref}/objects",
                            params={"path": "secret.bin"},
                        )
                        assert (
                            r.status_code == 200 and r.content == info[f"{name}_data"]
                        )
            yield hub, spoke, info


def check_enforced(spoke: Spoke, info: dict) -> None:
    a, b = info["a"], info["b"]
    with spoke.client(info["token_a"]) as c:
        # Its own repository: allowed.
        r = c.get(f"/api/v1/repos/{a}/refs/main/objects", params={"path": "secret.bin"})
        assert r.status_code == 200 and r.content == info["a_data"]
        # The other one, though every byte of it is in the spoke's cache: refused.
        for ref in ("main", info["b_commit"]):
            r = c.get(
                f"/api/v1/repos/{b}/refs/{ref}/objects", params={"path": "secret.bin"}
            )
            assert r.status_code == 403, (ref, r.status_code)
            assert info["b_data"][:64] not in r.content
            assert (
                c.head(
                    f"/api/v1/repos/{b}/refs/{ref}/objects",
                    params={"path": "secret.bin"},
                ).status_code
                == 403
            )
            assert (
                c.get(
                    f"/api/v1/repos/{b}/refs/{ref}/stat", params={"path": "secret.bin"}
                ).status_code
                == 403
            )
            assert c.get(f"/api/v1/repos/{b}/refs/{ref}/list").status_code == 403
            assert (
                c.get(
                    f"/api/v1/repos/{b}/refs/{ref}/entry", params={"path": "secret.bin"}
                ).status_code
                == 403
            )
        assert c.get(f"/api/v1/repos/{b}/refs/main/log").status_code == 403
        assert c.get(f"/api/v1/repos/{b}/branches").status_code == 403
        assert c.get(f"/api/v1/repos/{b}/branches/main/staging").status_code == 403
        # B's commit id under A's name is not a way in either.
        r = c.get(
            f"/api/v1/repos/{a}/refs/{info['b_commit']}/objects",
            params={"path": "secret.bin"},
        )
        assert r.status_code in (404, 503), (
            f"repository {b}'s commit was served under {a}: {r.status_code}"
        )
        assert info["b_data"][:64] not in r.content
        # Listing repositories shows only its own.
        names = [x["name"] for x in c.get("/api/v1/repos").json()]
        assert b not in names
        # Writes need a write role.
        r = c.put(
            f"/api/v1/repos/{a}/branches/main/objects",
            params={"path": "x"},
            content=b"x",
        )
        assert r.status_code == 403
    with spoke.client(None) as c:
        assert (
            c.get(
                f"/api/v1/repos/{b}/refs/main/objects", params={"path": "secret.bin"}
            ).status_code
            == 401
        )
    with spoke.client("not-a-token") as c:
        r = c.get(f"/api/v1/repos/{b}/refs/main/objects", params={"path": "secret.bin"})
        assert r.status_code in (401, 503) and info["b_data"][:64] not in r.content


def test_a_token_without_access_gets_403_for_cached_data_with_the_hub_up_and_down(
    setup,
) -> None:
    hub, spoke, info = setup
    check_enforced(spoke, info)
    hub.kill()
    time.sleep(1.5)
    check_enforced(spoke, info)
    # A token the spoke has never seen cannot be checked while the hub is away: refused, never served.
    with spoke.client(info["token_b_unused"]) as c:
        r = c.get(
            f"/api/v1/repos/{info['b']}/refs/main/objects",
            params={"path": "secret.bin"},
        )
        assert r.status_code == 503
        assert "hub" in r.json()["error"]["message"]


def test_a_commit_of_another_repository_is_not_served_under_this_one(setup) -> None:
    hub, spoke, info = setup
    with hub.client() as c:  # the hub's own answer
        r = c.get(
            f"/api/v1/repos/{info['a']}/refs/{info['b_commit']}/objects",
            params={"path": "secret.bin"},
        )
        assert r.status_code == 404
    with spoke.client() as c:  # the spoke, as admin, agrees with the hub
        r = c.get(
            f"/api/v1/repos/{info['a']}/refs/{info['b_commit']}/objects",
            params={"path": "secret.bin"},
        )
        assert r.status_code == 404, r.status_code
