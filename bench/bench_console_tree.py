"""Time to open a 100,000-file directory in the web console at a warm spoke.

    .venv/bin/python bench/bench_console_tree.py [--files 100000]

Starts a hub and a spoke on loopback (tests/hubserver.py, tests/spokeserver.py), commits
one directory of N files (all one content, staged as entries: no upload of N files), signs
in to the spoke's console and times GET of the directory's first page, a page in the middle
(``after=``), the first page of a diff that adds all N files, the repository page and its
history; the first request of each
is cold, the figure is the median of the next 5 (warm).
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.console_env import ConsoleEnv  # noqa: E402
from tests.hubserver import start_hub, unique_name  # noqa: E402
from tests.spokeserver import start_spoke  # noqa: E402


def timed(client, url: str, runs: int = 5) -> tuple[float, float]:  # noqa: ANN001
    t = time.perf_counter()
    r = client.get(url)
    cold = time.perf_counter() - t
    assert r.status_code == 200, r.text[:300]
    warm = []
    for _ in range(runs):
        t = time.perf_counter()
        assert client.get(url).status_code == 200
        warm.append(time.perf_counter() - t)
    return cold, statistics.median(warm)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=100_000)
    n = ap.parse_args().files
    tmp = Path(tempfile.mkdtemp(prefix="bench-console-"))
    with start_hub(tmp / "hub") as hub:
        plane = hub.plane()
        repo = unique_name("big")
        plane.create_repo(repo)
        base = plane.resolve_commit(repo, "main")
        plane.put_object(repo, "main", "seed.bin", io.BytesIO(b"x" * 4096))
        entry = plane.stat_chunks(repo, "main", "seed.bin")
        t = time.perf_counter()
        plane.commit_changes(repo, "main", {f"big/file-{i:06d}.bin": entry for i in range(n)}, f"{n} files")
        print(f"committed {n} entries in {time.perf_counter() - t:.1f} s")
        with start_spoke(hub.url, tmp / "cache", "1GiB", token=hub.token) as spoke:
            env = ConsoleEnv(hub, spoke, repo, "", "", "", "", "")
            c = env.session(spoke.url, hub.token)
            for name, url in (
                ("directory, first page", f"/ui/repos/{repo}/tree?path=big"),
                ("directory, a page in the middle", f"/ui/repos/{repo}/tree?path=big&after=big/file-{n // 2:06d}.bin"),
                ("diff adding every file, first page", f"/ui/repos/{repo}/diff?left={base}&right=main"),
                ("repository page (its logical size: a walk of the tree, then cached)", f"/ui/repos/{repo}"),
                ("history page (size change per commit)", f"/ui/repos/{repo}/log"),
            ):
                cold, warm = timed(c, url)
                print(f"{name}: cold {cold * 1000:.0f} ms, warm median {warm * 1000:.0f} ms")


if __name__ == "__main__":
    main()
