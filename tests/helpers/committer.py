"""A writer process for the concurrency tests: put a file, commit with --expect-head, repeat.

    python -m tests.helpers.committer --data DIR [--db URL] --repo R --branch B \
        --name W --count N --out RESULT.json [--via engine|cli] [--start-file F]

Each iteration stages ``W/<k>`` (content ``W-<k>``), reads the branch head,
and commits with that head as the expected one. A conflict means another
writer moved the branch: read the head again and retry. "Nothing to commit"
means another writer's commit already folded this file in (staging is shared
per branch); that is recorded as ``folded``. The result file lists every
attempt so the test can check that no update was lost.

``--via cli`` drives the real ``fabric`` command (``put``, ``log``,
``commit --expect-head``) instead of the engine API. ``--start-file``: wait
until that file exists, so several processes start together.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--db")
    ap.add_argument("--repo", required=True)
    ap.add_argument("--branch", default="main")
    ap.add_argument("--name", required=True)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--via", choices=("engine", "cli"), default="engine")
    ap.add_argument("--start-file")
    args = ap.parse_args()
    writer = EngineWriter(args) if args.via == "engine" else CliWriter(args)
    if args.start_file:
        deadline = time.monotonic() + 60
        while not os.path.exists(args.start_file) and time.monotonic() < deadline:
            time.sleep(0.005)
    attempts: list[dict] = []
    for k in range(args.count):
        path = f"{args.name}/{k}"
        writer.put(path, f"{args.name}-{k}".encode())
        while True:
            head = writer.head()
            outcome, commit_id = writer.commit(head, f"{args.name} {k}")
            attempts.append({"path": path, "expected": head, "outcome": outcome, "commit": commit_id})
            if outcome != "conflict":
                break
    with open(args.out, "w") as f:
        json.dump(attempts, f)


class EngineWriter:
    def __init__(self, args: argparse.Namespace) -> None:
        from fabric.engine.engine import Engine

        self.args = args
        self.engine = Engine.open(args.data, db_url=args.db)

    def put(self, path: str, data: bytes) -> None:
        self.engine.put_object(self.args.repo, self.args.branch, path, io.BytesIO(data))

    def head(self) -> str:
        return self.engine.head(self.args.repo, self.args.branch)

    def commit(self, head: str, message: str) -> tuple[str, str | None]:
        from fabric.errors import BadRequest, Conflict

        try:
            c = self.engine.commit(self.args.repo, self.args.branch, message, expected_head=head)
            return "ok", c.id
        except Conflict:
            return "conflict", None
        except BadRequest as exc:
            if "nothing to commit" in exc.message:
                return "folded", None
            raise


class CliWriter:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.base = [sys.executable, "-m", "fabric.cli.main", "--data", args.data, "-q"]
        if args.db:
            self.base += ["--db", args.db]
        self.target = f"{args.repo}@{args.branch}"

    def _run(self, *argv: str, data: bytes | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([*self.base, *argv], input=data, capture_output=True, timeout=120, check=False)

    def put(self, path: str, data: bytes) -> None:
        p = self._run("put", self.target, path, "-", data=data)
        if p.returncode != 0:
            raise SystemExit(f"put failed ({p.returncode}): {p.stderr.decode()}")

    def head(self) -> str:
        p = self._run("--json", "log", self.target, "-n", "1")
        if p.returncode != 0:
            raise SystemExit(f"log failed ({p.returncode}): {p.stderr.decode()}")
        return json.loads(p.stdout)[0]["id"]

    def commit(self, head: str, message: str) -> tuple[str, str | None]:
        p = self._run("commit", self.target, "-m", message, "--expect-head", head)
        if p.returncode == 0:
            return "ok", p.stdout.decode().strip()
        if p.returncode == 4:
            return "conflict", None
        if p.returncode == 2 and b"nothing to commit" in p.stderr:
            return "folded", None
        raise SystemExit(f"commit failed ({p.returncode}): {p.stderr.decode()}")


if __name__ == "__main__":
    main()
