"""The ledger of a soak: every write a client attempted, what came of it, and the checks of
every read against it.

Each path has exactly one writer (a client owns its branch), so a path's history is a
single-writer register and the checks are those of a register under indeterminate
operations (as Jepsen's checkers do):

* an operation that returned success is **acknowledged** (``ok``) at the durability it was
  promised, at the moment it returned;
* one that returned an error or timed out is **unknown**: it may or may not have taken
  effect, now or later;
* one the server refused for a reason that proves it did nothing (412 of a conditional
  write) is **failed**: its value may never be seen.

A **strict** read (at a place the write's durability promises: the spoke it was written
through at once, the hub once the spoke's backlog has drained) that started at ``t0`` and
ended at ``t1`` may return: the value of the last write acknowledged before ``t0`` (absent
if none), the value of any write invoked before ``t1`` and not acknowledged before ``t0``,
or the value of any unknown write. A **weak** read (a place the write is not promised to
have reached yet) may return absent or any value ever attempted for the path. A read
whose bytes are no value ever attempted for the path is a **wrong read**; a strict read
that returns an older acknowledged value is a **stale read**; both must never happen. At
the end, a path whose hub or home read is neither is a **lost write**.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

ABSENT = "<absent>"


def digest(data: bytes | None) -> str:
    return ABSENT if data is None else hashlib.sha256(data).hexdigest()


@dataclass
class Op:
    id: int
    client: str
    kind: str  # put | delete | rename-in | rename-out | multipart | cond-put
    key: tuple[str, str, str]  # (repo, branch, path)
    value: str  # sha256 of the content, or ABSENT for a delete
    durability: str  # local | hub
    home: str  # where it was written: spoke-a, spoke-b or hub
    t_invoke: float
    t_done: float | None = None
    status: str = "pending"  # pending | ok | unknown | failed


@dataclass
class CommitRecord:
    branch: tuple[str, str]
    id: str | None
    token: str  # the chaos-op metadata that identifies it in history
    t_invoke: float
    t_done: float | None
    status: str
    snapshot: dict[str, set[str]] = field(default_factory=dict)  # path -> allowed values at that commit
    tag: str | None = None
    tag_status: str = "none"
    tag_t_done: float | None = None


class Ledger:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.t_start = time.monotonic()
        self.ops: list[Op] = []
        self.by_key: dict[tuple[str, str, str], list[Op]] = {}
        self.commits: list[CommitRecord] = []
        self.reads = Counter()  # kind -> count
        self.violations: list[str] = []
        self.counts = Counter()  # wrong_reads, stale_reads, lost_writes, late_unknown
        self.ops_done = Counter()  # client op kind -> count
        self.errors = Counter()  # (client kind, error) -> count
        self.undocumented: list[str] = []
        self.hangs: list[str] = []
        self.longest_stall = (0.0, "")
        self.lag_max = 0.0  # the most a read passed only thanks to its lag trailed the write it missed
        self.tag_unseen_max = 0.0  # the oldest tag (seconds since acknowledged) a spoke did not know yet

    # -- recording -------------------------------------------------------------------
    def begin(self, client: str, kind: str, key, value: str, durability: str, home: str) -> Op:
        with self.lock:
            op = Op(len(self.ops), client, kind, tuple(key), value, durability, home, time.monotonic())
            self.ops.append(op)
            self.by_key.setdefault(op.key, []).append(op)
            return op

    def end(self, op: Op, status: str, at: float | None = None) -> None:
        with self.lock:
            op.status = status
            op.t_done = time.monotonic() if at is None else at

    def latency(self, what: str, seconds: float) -> None:
        with self.lock:
            if seconds > self.longest_stall[0]:
                self.longest_stall = (seconds, what)

    def error(self, client_kind: str, error: str, documented: bool, detail: str = "") -> None:
        with self.lock:
            self.errors[f"{client_kind}:{error}"] += 1
            if not documented and len(self.undocumented) < 200:
                self.undocumented.append(f"{client_kind}: {error} {detail}"[:500])

    def violation(self, counter: str, message: str) -> None:
        with self.lock:
            self.counts[counter] += 1
            if len(self.violations) < 200:
                self.violations.append(f"{counter}: {message}"[:800])

    def keys(self) -> list[tuple[str, str, str]]:
        with self.lock:
            return list(self.by_key)

    def history(self, key) -> list[Op]:
        with self.lock:
            return list(self.by_key.get(tuple(key), ()))

    def acked(self) -> int:
        with self.lock:
            return sum(1 for op in self.ops if op.status == "ok") + sum(1 for c in self.commits if c.status == "ok")

    # -- what a read may return ------------------------------------------------------------
    def allowed(self, key, t0: float, t1: float, strict: bool) -> tuple[set[str], set[str]]:
        """(values a read in [t0, t1] may return, values it may return only through an unknown
        write that landed after a later acknowledged one: allowed, but counted as late)."""
        hist = [op for op in self.history(key) if op.t_invoke < t1]
        if not strict:
            return {ABSENT} | {op.value for op in hist if op.status != "failed"}, set()
        last = None
        for i, op in enumerate(hist):
            if op.status == "ok" and op.t_done is not None and op.t_done <= t0:
                last = i
        ok = {hist[last].value} if last is not None else {ABSENT}
        late: set[str] = set()
        for i, op in enumerate(hist):
            if op.status == "failed":
                continue
            if last is None or i > last:
                ok.add(op.value)
            elif op.status == "unknown":
                late.add(op.value)
        return ok, late - ok

    def check_read(self, what: str, key, t0: float, t1: float, got: str, strict: bool, lag: float = 0.0) -> bool:
        """Record a read and check it; False when it is a violation. ``lag``: the read may be as
        old as a strict read started that much earlier (a cache the documentation allows, e.g. a
        mount's kernel cache of names); reads that pass only thanks to it are counted."""
        with self.lock:
            self.reads[what.split(" ")[0]] += 1
        ok, late = self.allowed(key, t0, t1, strict)
        if got in ok:
            return True
        if got in late:
            with self.lock:
                self.counts["late_unknown"] += 1
            return True
        if lag and strict:
            lagged, lagged_late = self.allowed(key, t0 - lag, t1, strict)
            if got in lagged | lagged_late:
                acked = [op.t_done for op in self.history(key) if op.status == "ok" and op.t_done is not None
                         and op.t_done <= t0]
                with self.lock:
                    self.counts["lagged_reads"] += 1
                    if acked:  # how long before the read began the write it did not see was acknowledged
                        self.lag_max = max(self.lag_max, t0 - max(acked))
                return True
        ever = {op.value for op in self.history(key)}
        why = f"read {t0 - self.t_start:.2f}..{t1 - self.t_start:.2f}s; {self.story(key, t1)}"
        if got != ABSENT and got not in ever:
            self.violation("wrong_reads", f"{what} {key}: bytes {got[:12]} were never written there; {why}")
        elif strict:
            self.violation("stale_reads", f"{what} {key}: got {got[:12]}, allowed {sorted(v[:12] for v in ok)}; {why}")
        else:
            self.violation("wrong_reads", f"{what} {key}: got {got[:12]} (a refused write's value?); {why}")
        return False

    def story(self, key, until: float, last: int = 6) -> str:
        """The last writes of ``key`` invoked before ``until``: id, kind, value, outcome, times (soak seconds)."""
        hist = [op for op in self.history(key) if op.t_invoke < until][-last:]
        return "history " + "; ".join(
            f"#{op.id} {op.client} {op.kind} {op.value[:12]} {op.status} "
            f"{op.t_invoke - self.t_start:.2f}..{(op.t_done or 0) - self.t_start:.2f}" for op in hist)

    def snapshot(self, branch: tuple[str, str], t0: float, t1: float) -> dict[str, set[str]]:
        """Allowed values of every path of ``branch`` for a commit invoked at t0 and done at t1."""
        out = {}
        for key in self.keys():
            if key[:2] == branch:
                ok, late = self.allowed(key, t0, t1, strict=True)
                out[key[2]] = ok | late
        return out
