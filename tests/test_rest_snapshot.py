"""A REST GET serves the bytes of the commit its ``X-Fabric-Commit`` names, even while the
branch moves under it (a real hub over loopback HTTP)."""

from __future__ import annotations

import threading

from tests.hubserver import Hub, unique_name

API = "/api/v1"
#: Commits prepared on a side branch; the race moves ``main`` through them, each once (no A-B-A).
COMMITS = 400
READERS = 3


def content(i: int) -> bytes:
    return f"version {i:05d} ".encode() * 50


def test_get_racing_with_branch_moves_serves_the_named_commit(hub: Hub) -> None:
    repo = unique_name("snap")
    holds: dict[str, bytes] = {}
    with hub.client() as c:
        assert c.post(f"{API}/repos", json={"name": repo}).status_code == 201
        assert c.post(f"{API}/repos/{repo}/branches", json={"name": "feed", "source": "main"}).status_code == 201
        for i in range(COMMITS):
            r = c.put(f"{API}/repos/{repo}/branches/feed/objects", params={"path": "f.bin"}, content=content(i))
            assert r.status_code == 201, r.text
            r = c.post(f"{API}/repos/{repo}/branches/feed/commits", json={"message": f"v{i}"})
            assert r.status_code == 201, r.text
            holds[r.json()["id"]] = content(i)
        order = list(holds)
        r = c.post(f"{API}/repos/{repo}/branches/main/reset", json={"ref": order[0]})
        assert r.status_code == 200, r.text

    done = threading.Event()
    wrong: list[str] = []
    served = [0]

    def mover() -> None:
        # The branch moves to a new commit as fast as the hub allows; only main's ref changes.
        with hub.client() as c:
            for cid in order[1:]:
                assert c.post(f"{API}/repos/{repo}/branches/main/reset", json={"ref": cid}).status_code == 200
        done.set()

    def reader() -> None:
        with hub.client() as c:
            while not done.is_set():
                r = c.get(f"{API}/repos/{repo}/refs/main/objects", params={"path": "f.bin"})
                assert r.status_code == 200, r.text
                named = r.headers["x-fabric-commit"]
                served[0] += 1
                if r.content != holds[named]:
                    got = next((cid for cid, data in holds.items() if data == r.content), "?")
                    wrong.append(f"X-Fabric-Commit {named[:12]} but the bytes of {got[:12]}")

    threads = [threading.Thread(target=mover)] + [threading.Thread(target=reader) for _ in range(READERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert served[0] > COMMITS // 2  # the readers did race with the moves
    assert not wrong, f"{len(wrong)} of {served[0]} GETs served bytes of another commit: {wrong[:5]}"
