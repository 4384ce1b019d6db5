"""Spoke groups (issue 15.1): each chunk crosses the WAN once per region.

One hub; spokes in a group, each behind its own WAN proxy to the hub
(testbed's ``WanProxy`` counts the bytes), so WAN bytes are measured where they
cross. Datasets are random (incompressible) files of 1 MiB: 24 MiB for the
three-reader test (the issue asks 256 MiB; 24 keeps the test well under a
minute on two cores), 12 MiB elsewhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from fabric.util.groups import member_url
from fabric.util.net import free_port
from spoke.group import owner, rank
from testbed.wanproxy import WanProxy
from tests.hubserver import Hub, hub_env, unique_name
from tests.spokeserver import ROOT, Dataset, Spoke, frame_bytes, random_dataset, start_spoke, wait_for

MiB = 1 << 20

pytestmark = pytest.mark.timeout(180)


# -- rendezvous hashing (pure) ----------------------------------------------------------
IDS = [hashlib.blake2b(i.to_bytes(4, "little"), digest_size=32).digest() for i in range(6000)]
THREE = ["http://10.0.0.1:8700", "http://10.0.0.2:8700", "http://10.0.0.3:8700"]


def test_a_fourth_member_takes_about_a_quarter_of_the_keys_and_only_from_the_others() -> None:
    four = THREE + ["http://10.0.0.4:8700"]
    moved = [cid for cid in IDS if owner(cid, THREE) != owner(cid, four)]
    assert 0.18 < len(moved) / len(IDS) < 1 / 3
    assert all(owner(cid, four) == four[3] for cid in moved)  # keys move only to the newcomer


def test_a_member_that_leaves_moves_only_its_own_keys_each_to_its_next_owner() -> None:
    two = THREE[:2]
    for cid in IDS:
        before, after = owner(cid, THREE), owner(cid, two)
        if before != THREE[2]:
            assert after == before
        else:
            assert after == rank(cid, THREE)[1]
    shares = [sum(owner(cid, THREE) == m for cid in IDS) / len(IDS) for m in THREE]
    assert all(0.28 < s < 0.39 for s in shares), shares


def test_every_member_computes_the_same_owner_whatever_the_order_it_lists_the_group_in() -> None:
    assert all(owner(cid, THREE) == owner(cid, THREE[::-1]) == rank(cid, THREE)[0] for cid in IDS[:500])


def test_member_urls_have_one_canonical_form_and_nonsense_is_refused() -> None:
    from fabric.errors import BadRequest

    assert member_url("HTTP://Spoke-1:8700/") == member_url("http://spoke-1:8700") == "http://spoke-1:8700"
    for bad in ("", "spoke-1:8700", "ftp://spoke-1", "http://u:p@spoke-1:8700", "http://spoke-1:8700/?x=1", "http://" + "a" * 600):
        with pytest.raises(BadRequest):
            member_url(bad)


# -- a group of real spokes -------------------------------------------------------------
@dataclass
class Member:
    spoke: Spoke
    wan: WanProxy


class Group:
    """Spokes of one group, each with its own WAN proxy to the hub."""

    def __init__(self, hub: Hub, tmp_path, token: str, stack: contextlib.ExitStack, name: str | None) -> None:
        self.hub, self.tmp_path, self.token, self.stack = hub, tmp_path, token, stack
        self.name = name
        self.members: list[Member] = []

    def add(self, peers: list[int] | None = None, port: int | None = None) -> Member:
        """Start one more spoke: in group ``name`` at the hub, or with a fixed list of peer ports."""
        port = port or free_port()
        url = f"http://127.0.0.1:{port}"
        hub_port = int(self.hub.url.rsplit(":", 1)[1])
        wan = self.stack.enter_context(WanProxy("127.0.0.1", hub_port, handshake=False))
        if peers is None:
            args = ["--group", self.name, "--advertise", url]
        else:
            args = ["--peers", ",".join(f"http://127.0.0.1:{p}" for p in peers), "--advertise", url]
        cache = self.tmp_path / f"spoke{len(self.members)}"
        spoke = self.stack.enter_context(
            start_spoke(wan.url_for(), cache, "256MiB", token=self.token, args=args + ["--log-level", "warning"], port=port)
        )
        member = Member(spoke, wan)
        self.members.append(member)
        return member

    def wan_bytes(self) -> int:
        return sum(m.wan.bytes_up + m.wan.bytes_down for m in self.members)

    def wait_members(self, n: int, among: list[Member] | None = None) -> list[str]:
        """Wait until every spoke (of ``among``) sees ``n`` members; the member list."""
        def views() -> list[str] | None:
            lists = [m.spoke.stats()["group"]["members"] for m in among or self.members]
            return lists[0] if all(len(x) == n and x == lists[0] for x in lists) else None

        return wait_for(views, timeout=20, interval=0.2)


@pytest.fixture
def spoke_token(hub: Hub) -> str:
    return hub.plane().create_token(unique_name("group-spoke"), roles={"*": "read"}, rights=["spoke"])["token"]


@pytest.fixture
def group(hub: Hub, tmp_path, spoke_token: str) -> Iterator[Group]:
    with contextlib.ExitStack() as stack:
        yield Group(hub, tmp_path, spoke_token, stack, unique_name("region"))


def read_files(spoke: Spoke, data: Dataset, paths: list[str]) -> None:
    plane = spoke.plane()
    try:
        for path in paths:
            got = b"".join(plane.read_stream(data.repo, data.commit, path))
            assert hashlib.sha256(got).digest() == hashlib.sha256(data.files[path]).digest(), path
    finally:
        plane.close()


def in_threads(*jobs) -> None:
    """Run each ``(fn, args)`` in a thread; re-raise the first failure."""
    errors: list[BaseException] = []

    def run(fn, *args) -> None:
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(fn, *args)) for fn, *args in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]


def test_three_readers_on_three_spokes_move_the_dataset_over_the_wan_once(hub: Hub, group: Group) -> None:
    data = random_dataset(hub.plane(), 24, 1000)
    for _ in range(3):
        group.add()
    group.wait_members(3)
    before = group.wan_bytes()
    paths = sorted(data.files)
    # Each reader starts at a different third of the dataset, so the three contend for chunks.
    in_threads(*[(read_files, m.spoke, data, paths[8 * i :] + paths[: 8 * i]) for i, m in enumerate(group.members)])
    wan = group.wan_bytes() - before
    assert wan <= 1.05 * data.frames, (wan, data.frames)
    stats = [m.spoke.stats() for m in group.members]
    # Two thirds of what each spoke read came from the other two, over the LAN, counted apart.
    assert all(s["group"]["peer_chunks"] > len(data.ids) / 3 for s in stats), [s["group"] for s in stats]
    assert all(s["peer_bytes_received"] > data.frames / 3 for s in stats)
    assert sum(s["upstream_bytes_received_demand"] + s.get("upstream_bytes_received_prefetch", 0) for s in stats) < 1.02 * data.frames


def test_an_owner_killed_mid_read_costs_a_fallback_not_an_error(hub: Hub, group: Group) -> None:
    data = random_dataset(hub.plane(), 12, 2000)
    for _ in range(3):
        group.add()
    group.wait_members(3)
    survivors, victim = group.members[:2], group.members[2]
    paths = sorted(data.files)
    # Both readers read the first files, then the third spoke dies (SIGKILL), then they read on:
    # about a third of the chunks they still need were the dead spoke's.
    in_threads(*[(read_files, m.spoke, data, paths[:3]) for m in survivors])
    victim.spoke.kill()
    in_threads(*[(read_files, m.spoke, data, paths[3:]) for m in survivors])
    stats = [m.spoke.stats()["group"] for m in survivors]
    victim_url = member_url(victim.spoke.url)
    assert any(victim_url in s["peers_down"] for s in stats), stats
    assert sum(s["peer_fallback_chunks"] for s in stats) > 0
    # The hub lets the silent member go after three missed heartbeats; the others follow.
    assert victim_url not in group.wait_members(2, survivors)


def test_a_fourth_spoke_refetches_only_the_chunks_that_moved_to_it(hub: Hub, group: Group) -> None:
    # How many keys move is a property of the hash, measured over 6,000 ids by the tests at the top;
    # a live dataset has too few chunks for a fraction to be more than noise. Here: which ones cross the WAN.
    data = random_dataset(hub.plane(), 12, 3000)
    for _ in range(3):
        group.add()
    three = group.wait_members(3)
    read_files(group.members[0].spoke, data, sorted(data.files))  # each chunk now cached at its owner
    group.add()
    four = group.wait_members(4)
    newcomer = member_url(group.members[3].spoke.url)
    moved = [cid for cid in data.ids if owner(cid, three) != owner(cid, four)]
    assert all(owner(cid, four) == newcomer for cid in moved)
    # The newcomer reads the whole dataset: only the chunks that moved to it cross the WAN again.
    before = group.wan_bytes()
    read_files(group.members[3].spoke, data, sorted(data.files))
    wan = group.wan_bytes() - before
    moved_frames = frame_bytes(hub.plane(), moved)
    assert wan <= moved_frames + 0.05 * data.frames, (wan, moved_frames, data.frames)


def test_a_static_peer_list_shares_caches_without_the_hub(hub: Hub, group: Group) -> None:
    data = random_dataset(hub.plane(), 12, 4000)
    ports = [free_port() for _ in range(3)]
    for port in ports:
        group.add(peers=ports, port=port)
    before = group.wan_bytes()
    read_files(group.members[0].spoke, data, sorted(data.files))
    read_files(group.members[1].spoke, data, sorted(data.files))
    assert group.wan_bytes() - before <= 1.05 * data.frames
    stats = [m.spoke.stats()["group"] for m in group.members]
    assert all(s["source"] == "static" and len(s["members"]) == 3 for s in stats)
    assert stats[1]["peer_chunks"] > 0
    with hub.client(group.token) as c:  # nothing was registered at the hub
        assert c.get(f"/api/v1/groups/{group.name}/members").json()["members"] == []


def test_only_a_spoke_token_may_join_a_group_or_ask_as_a_peer(hub: Hub, group: Group) -> None:
    data = random_dataset(hub.plane(), 1, 5000)
    reader = hub.plane().create_token(unique_name("reader"), roles={"*": "read"})["token"]
    own = hub.plane().create_token(unique_name("own"), roles={data.repo: "read"})["token"]
    members = f"/api/v1/groups/{group.name}/members"
    with hub.client(reader) as c:
        for r in (c.post(members, json={"url": "http://127.0.0.1:9"}), c.get(members)):
            assert r.status_code == 403 and "spoke right" in r.json()["error"]["message"]
    with hub.client(group.token) as c:
        for bad_name, body in (("bad name!", {"url": "http://127.0.0.1:9"}), (group.name, {"url": "ftp://x"}), (group.name, {})):
            r = c.post(f"/api/v1/groups/{bad_name}/members", json=body)
            assert r.status_code in (400, 404, 422), r.text
        assert c.get(members).json()["members"] == []  # nothing was registered

    member = group.add()
    ids = {"ids": [cid.hex() for cid in data.ids]}
    peer = {"X-Fabric-Peer": "1"}
    with member.spoke.client(reader) as c:
        r = c.post("/api/v1/chunks/frames", json=ids, headers=peer)
        assert r.status_code == 403 and "spoke right" in r.json()["error"]["message"]
        assert c.post("/api/v1/chunks/frames", json=ids).status_code == 200  # the same token, as a reader
    with member.spoke.client(own) as c:
        r = c.post("/api/v1/chunks/frames", params={"repo": data.repo}, json=ids, headers=peer)
        assert r.status_code == 403
    with member.spoke.client(group.token) as c:
        assert c.post("/api/v1/chunks/frames", json=ids, headers={"X-Fabric-Peer": "yes"}).status_code == 400
        r = c.post("/api/v1/chunks/frames", json=ids, headers=peer)
        assert r.status_code == 200 and len(r.content) > data.frames
    assert member.spoke.stats()["group"]["chunks_asked_by_peers"] == len(data.ids)


def test_spoke_group_options_are_checked_before_anything_starts(tmp_path) -> None:
    base = [sys.executable, "-m", "fabric.cli.main", "spoke", "--hub", "http://127.0.0.1:9", "--cache", str(tmp_path / "c"), "--cache-size", "64MiB"]
    cases = [
        (["--group", "g"], "--advertise"),
        (["--group", "g", "--peers", "http://a:1", "--advertise", "http://b:1"], "do not go together"),
        (["--advertise", "http://b:1"], "--advertise"),
        (["--peers", " , ", "--advertise", "http://b:1"], "at least one URL"),
    ]
    for extra, message in cases:
        r = subprocess.run(base + extra, capture_output=True, env=hub_env(), cwd=ROOT, timeout=60)
        assert r.returncode != 0 and message in r.stderr.decode(), (extra, r.stderr.decode())
        assert not os.path.exists(tmp_path / "c" / "chunks")
    help_text = subprocess.run(base[:4] + ["--help"], capture_output=True, env=hub_env(), cwd=ROOT, timeout=60).stdout.decode()
    assert all(opt in help_text for opt in ("--group", "--peers", "--advertise", "--peer-timeout"))


def test_a_spoke_whose_token_lacks_the_spoke_right_cannot_join(hub: Hub, tmp_path) -> None:
    reader = hub.plane().create_token(unique_name("reader"), roles={"*": "read"})["token"]
    port = free_port()
    with pytest.raises(RuntimeError, match="spoke right"):
        with start_spoke(hub.url, tmp_path / "c", "64MiB", token=reader, args=["--group", "g1", "--advertise", f"http://127.0.0.1:{port}"], port=port):
            pass
    assert httpx.get(hub.url + "/api/v1/groups/g1/members", headers={"Authorization": f"Bearer {hub.token}"}).json()["members"] == []
