"""Concurrent commits to one branch: compare-and-swap, a clear conflict, never a lost update.

Threads share one engine; processes share one data directory and catalog
(SQLite file or PostgreSQL database) and run ``tests/helpers/committer.py``.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from collections import Counter

import pytest

from fabric.engine.engine import Engine
from fabric.errors import BadRequest, Conflict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def check_history(engine: Engine, repo: str, branch: str, base: str, attempts: list[dict]) -> None:
    """The branch history is exactly the successful commits, chained by their expected heads."""
    ok = [a for a in attempts if a["outcome"] == "ok"]
    assert ok, "no commit succeeded"
    # Walk first parents from the head back to the base commit.
    chain = []
    cid = engine.head(repo, branch)
    while cid != base:
        commit = engine.get_commit(repo, cid)
        assert len(commit.parents) == 1
        chain.append(cid)
        cid = commit.parents[0]
    assert len(chain) == len(ok), f"{len(chain)} commits in history, {len(ok)} successful commits"
    assert set(chain) == {a["commit"] for a in ok}
    log = engine.log(repo, branch, limit=100_000)
    assert [c.id for c in log] == chain + [base] + [c.id for c in log[len(chain) + 1 :]]
    # Compare-and-swap: each success's parent is the head it expected, and no
    # head had two successors.
    for a in ok:
        assert engine.get_commit(repo, a["commit"]).parents == (a["expected"],)
    per_head = Counter(a["expected"] for a in ok)
    assert max(per_head.values()) == 1, "two commits succeeded against the same expected head"
    # A conflict was only reported when the head had really moved on.
    chain_set = set(chain) | {base}
    for a in attempts:
        if a["outcome"] == "conflict":
            assert a["expected"] in chain_set
            assert per_head.get(a["expected"]) == 1, "a conflict on a head that nobody moved"
    # No lost update: every file any writer put is in the final head, intact.
    for path in {a["path"] for a in attempts}:
        name, k = path.split("/")
        assert engine.read(repo, branch, path) == f"{name}-{k}".encode()
    committed = {p for p, _ in engine.walk(repo, branch)}
    assert committed == {a["path"] for a in attempts}
    assert list(engine.uncommitted(repo, branch)) == []


def test_threads_exactly_one_winner_per_head(engine: Engine) -> None:
    engine.create_repo("demo")
    threads_n, rounds = 8, 5
    barrier = threading.Barrier(threads_n, timeout=120)
    results: list[list[tuple]] = [[] for _ in range(rounds)]
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        try:
            for r in range(rounds):
                barrier.wait()
                head = engine.head("demo", "main")
                engine.put_object("demo", "main", f"t{i}/r{r}", io.BytesIO(f"t{i}-r{r}".encode()))
                barrier.wait()  # everyone has staged and holds the same expected head
                try:
                    c = engine.commit("demo", "main", f"t{i} r{r}", expected_head=head)
                    outcome = ("ok", head, c.id)
                except Conflict as exc:
                    outcome = ("conflict", head, exc.details.get("head"))
                with lock:
                    results[r].append(outcome)
                barrier.wait()  # the round is over before anyone reads the next head
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            barrier.abort()

    base = engine.head("demo", "main")
    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads_n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    assert not errors, errors
    winners = []
    for r, outcomes in enumerate(results):
        kinds = Counter(o[0] for o in outcomes)
        assert kinds == {"ok": 1, "conflict": threads_n - 1}, f"round {r}: {kinds}"
        (win,) = [o for o in outcomes if o[0] == "ok"]
        heads = {o[1] for o in outcomes}
        assert len(heads) == 1  # all expected the same head
        # Every loser was told the head that beat it.
        assert all(o[2] == win[2] for o in outcomes if o[0] == "conflict")
        # The winner folded everyone's staged file of this round into its commit.
        winners.append(win[2])
        changes = {c.path for c in engine.diff("demo", win[1], win[2])}
        assert changes == {f"t{i}/r{r}" for i in range(threads_n)}
    log = engine.log("demo", "main", limit=1000)
    assert [c.id for c in log] == list(reversed(winners)) + [base]
    assert {p for p, _ in engine.walk("demo", "main")} == {f"t{i}/r{r}" for i in range(threads_n) for r in range(rounds)}
    assert list(engine.uncommitted("demo", "main")) == []


def test_threads_free_running_no_lost_update(engine: Engine) -> None:
    engine.create_repo("demo")
    base = engine.head("demo", "main")
    attempts: list[dict] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Event()

    def worker(i: int) -> None:
        try:
            start.wait()
            for k in range(8):
                path = f"w{i}/{k}"
                engine.put_object("demo", "main", path, io.BytesIO(f"w{i}-{k}".encode()))
                while True:
                    head = engine.head("demo", "main")
                    try:
                        c = engine.commit("demo", "main", f"{path}", expected_head=head)
                        a = {"path": path, "expected": head, "outcome": "ok", "commit": c.id}
                    except Conflict:
                        a = {"path": path, "expected": head, "outcome": "conflict", "commit": None}
                    except BadRequest as exc:
                        assert "nothing to commit" in exc.message
                        a = {"path": path, "expected": head, "outcome": "folded", "commit": None}
                    with lock:
                        attempts.append(a)
                    if a["outcome"] != "conflict":
                        break
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    start.set()
    for t in ts:
        t.join(300)
    assert not errors, errors
    assert any(a["outcome"] == "conflict" for a in attempts), "the writers never collided; the test proved nothing"
    check_history(engine, "demo", "main", base, attempts)


def _run_writers(data: str, db: str | None, tmp_path, count: int, via: str, writers: int = 2) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=ROOT, FABRIC_AUTHOR="tester")
    start_file = str(tmp_path / f"go-{via}")
    procs = []
    for w in range(writers):
        cmd = [
            sys.executable, "-m", "tests.helpers.committer", "--data", data, "--repo", "demo", "--name", f"p{w}",
            "--count", str(count), "--out", str(tmp_path / f"p{w}-{via}.json"), "--via", via, "--start-file", start_file,
        ]
        if db:
            cmd += ["--db", db]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    open(start_file, "w").close()
    attempts: list[dict] = []
    for w, p in enumerate(procs):
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, f"writer {w} failed: {err.decode()[-2000:]}"
        with open(tmp_path / f"p{w}-{via}.json") as f:
            attempts.extend(json.load(f))
    return attempts


def test_two_processes_no_lost_update(tmp_path, db_url: str) -> None:
    data = str(tmp_path / "hub")
    engine = Engine.open(data, db_url=db_url)
    try:
        engine.create_repo("demo")
        base = engine.head("demo", "main")
        attempts = _run_writers(data, db_url, tmp_path, count=40, via="engine")
        assert len({a["path"] for a in attempts}) == 80
        assert any(a["outcome"] == "conflict" for a in attempts), "the writers never collided"
        check_history(engine, "demo", "main", base, attempts)
    finally:
        engine.close()


def test_two_cli_processes_no_lost_update(tmp_path, db_url: str) -> None:
    data = str(tmp_path / "hub")
    engine = Engine.open(data, db_url=db_url)
    try:
        engine.create_repo("demo")
        base = engine.head("demo", "main")
        attempts = _run_writers(data, db_url, tmp_path, count=4, via="cli")
        check_history(engine, "demo", "main", base, attempts)
    finally:
        engine.close()


@pytest.mark.parametrize("n", [3])
def test_concurrent_commits_on_different_branches_do_not_conflict(engine: Engine, n: int) -> None:
    engine.create_repo("demo")
    for i in range(n):
        engine.create_branch("demo", f"b{i}", "main")
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for k in range(5):
                head = engine.head("demo", f"b{i}")
                engine.put_object("demo", f"b{i}", f"f{k}", io.BytesIO(b"x" * k))
                engine.commit("demo", f"b{i}", f"b{i} {k}", expected_head=head)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not errors, errors
    for i in range(n):
        assert len(engine.log("demo", f"b{i}")) == 6
        assert {p for p, _ in engine.walk("demo", f"b{i}")} == {f"f{k}" for k in range(5)}
