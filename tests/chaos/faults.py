"""Faults at random moments: a schedule drawn from ``random.Random(seed)``; each fault has a
duration, then its recovery. At most two faults are active at once, never two on one target.

Kinds (targets): kill -9 then restart of a spoke, a hub or a mount process; SIGSTOP then
SIGCONT of a hub; a WAN link cut then restored, slowed, or stalled (packets held, no reset);
a spoke's cache disk filled then freed; a byte flipped in a hub pack then put back (an
operator restoring the pack from a backup); a byte flipped in a spoke's cached chunk file
(then that spoke's fsck, which must find and drop it).

Corruption is injected only into the data of the victim repository (written before the
clients start, read by the readers), never into client data, so that the ledger's checks
stay exact: reads of damaged chunks must fail or return the right bytes (a cached copy),
and fsck must report the damage (see docs/chaos.md).
"""

from __future__ import annotations

import contextlib
import heapq
import os
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass

import httpx

from tests.chaos.deploy import Deployment


@dataclass
class Fault:
    kind: str
    target: str
    duration: float
    started: float = 0.0
    detail: str = ""


def flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x5A]))
        f.flush()
        os.fsync(f.fileno())


class Injector(threading.Thread):
    def __init__(self, dep: Deployment, seed: int, stop: threading.Event, victim_locations: list[tuple[str, int, int, bytes]],
                 victim_chunks: list[bytes], corrupt: threading.Event, log, scale: float = 1.0) -> None:
        super().__init__(name="chaos-faults", daemon=True)
        self.dep, self.rng, self.stop_event = dep, random.Random(seed ^ 0xFA17), stop
        self.victim_locations, self.victim_chunks = victim_locations, victim_chunks
        self.corrupt = corrupt  # set while a corruption fault is active (readers accept 500 corruption then)
        self.log = log
        self.scale = scale
        self.paused = threading.Event()  # set: draw no new fault (a checkpoint is running)
        self.active: list[tuple[float, int, Fault]] = []
        self.lock = threading.Lock()
        self.counts = Counter()
        self.findings: list[str] = []  # what a fault showed that must not happen
        self.history: list[str] = []
        self.n = 0

    # -- the schedule ----------------------------------------------------------------------
    def kinds(self) -> list[tuple[str, str, float]]:
        out = []
        for s in self.dep.spokes:
            out += [("spoke-kill", s.name, 2), ("link-cut", s.name, 2), ("link-slow", s.name, 1),
                    ("link-stall", s.name, 1.5), ("cache-flip", s.name, 0.7)]
            if s.disk is not None:
                out.append(("disk-full", s.name, 1))
        for h in self.dep.hubs:
            out += [("hub-kill", h.name, 1.5), ("hub-stop", h.name, 1.2)]
        for name in self.dep.mounts:
            out.append(("mount-kill", name, 1.2))
        if self.victim_locations:
            out.append(("pack-flip", "hub-store", 0.7))
        return out

    def run(self) -> None:
        while not self.stop_event.is_set():
            gap = self.rng.uniform(3.0, 9.0) * self.scale
            kinds = self.kinds()
            kind, target, _ = self.rng.choices(kinds, weights=[w for _, _, w in kinds])[0]
            duration = self.rng.uniform(*{"link-slow": (5, 15), "link-stall": (2, 8), "disk-full": (3, 10),
                                          "pack-flip": (5, 15), "cache-flip": (2, 5)}.get(kind, (2, 10)))
            deadline = time.monotonic() + gap
            while time.monotonic() < deadline and not self.stop_event.is_set():
                self.recover_due()
                time.sleep(0.1)
            if self.stop_event.is_set():
                break
            if self.paused.is_set():
                continue
            with self.lock:
                busy = {f.target for _, _, f in self.active}
                if len(self.active) >= 2 or target in busy or ("hub" in target and any("hub" in b for b in busy)):
                    self.counts["skipped"] += 1
                    continue
            self.inject(Fault(kind, target, duration))
        self.heal_all()

    def recover_due(self) -> None:
        now = time.monotonic()
        while True:
            with self.lock:
                if not self.active or self.active[0][0] > now:
                    return
                _, _, fault = heapq.heappop(self.active)
            self.recover(fault)

    def heal_all(self) -> None:
        """Recover every active fault now (checkpoints and the end)."""
        while True:
            with self.lock:
                if not self.active:
                    return
                _, _, fault = heapq.heappop(self.active)
            self.recover(fault)

    # -- faults ----------------------------------------------------------------------------
    def spoke(self, name: str):
        return next(s for s in self.dep.spokes if s.name == name)

    def hub(self, name: str):
        return next(h for h in self.dep.hubs if h.name == name)

    def inject(self, f: Fault) -> None:
        f.started = time.monotonic()
        try:
            if f.kind == "spoke-kill":
                self.spoke(f.target).proc.kill()
            elif f.kind == "hub-kill":
                self.hub(f.target).kill()
            elif f.kind == "hub-stop":
                self.hub(f.target).pause()
            elif f.kind == "mount-kill":
                self.dep.mounts[f.target].kill()
            elif f.kind == "link-cut":
                for link in self.spoke(f.target).links:
                    link.cut()
            elif f.kind == "link-slow":
                delay, rate = self.rng.uniform(50, 400), self.rng.choice([None, 2.0, 10.0, 50.0])
                for link in self.spoke(f.target).links:
                    link.shape(delay / 2, delay / 2, rate)
                f.detail = f"rtt {delay:.0f} ms, rate {rate or 'uncapped'} Mbit/s"
            elif f.kind == "link-stall":
                for link in self.spoke(f.target).links:
                    link.stall(f.duration)
            elif f.kind == "disk-full":
                f.detail = f"filled {self.spoke(f.target).disk.fill() >> 20} MiB"
            elif f.kind == "pack-flip":
                path, offset, length, cid = self.rng.choice(self.victim_locations)
                at = offset + self.rng.randrange(8, max(9, length - 8))
                flip(path, at)
                f.detail = f"{path}@{at} chunk {cid.hex()[:16]}"
                f.target = "hub-store"
                f._undo = (path, at, cid)  # type: ignore[attr-defined]
                self.corrupt.set()
                self.check_hub_fsck_finds(cid)
            elif f.kind == "cache-flip":
                if not self.flip_cache(f):
                    self.counts["cache-flip-unavailable"] += 1
                    return
        except Exception as exc:
            self.findings.append(f"injecting {f.kind} on {f.target} failed: {exc!r}")
            return
        self.counts[f.kind] += 1
        self.n += 1
        self.history.append(f"{f.started:.1f} {f.kind} {f.target} {f.duration:.1f}s {f.detail}")
        self.log(f"fault: {f.kind} {f.target} for {f.duration:.1f}s {f.detail}")
        with self.lock:
            heapq.heappush(self.active, (f.started + f.duration, self.n, f))

    def recover(self, f: Fault) -> None:
        try:
            if f.kind == "spoke-kill":
                self.restart(self.spoke(f.target).proc)
            elif f.kind == "hub-kill":
                self.restart(self.hub(f.target))
            elif f.kind == "hub-stop":
                self.hub(f.target).resume()
            elif f.kind == "mount-kill":
                self.remount(f)
            elif f.kind == "link-cut":
                for link in self.spoke(f.target).links:
                    link.restore()
            elif f.kind == "link-slow":
                for link in self.spoke(f.target).links:
                    link.shape(5.0, 5.0, None)
            elif f.kind == "disk-full":
                self.spoke(f.target).disk.free()
            elif f.kind == "pack-flip":
                path, at, cid = f._undo  # type: ignore[attr-defined]
                flip(path, at)  # the same xor puts the byte back
                self.corrupt.clear()
            elif f.kind == "cache-flip":
                self.check_spoke_fsck_finds(f)
        except Exception as exc:
            self.findings.append(f"recovering from {f.kind} on {f.target} failed: {exc!r}")

    def restart(self, proc, tries: int = 5) -> None:
        for attempt in range(tries):
            try:
                proc.start()
                return
            except RuntimeError as exc:
                self.findings.append(f"{proc.name} did not come back (attempt {attempt + 1}): {exc}")
                proc.kill()
                time.sleep(2)
        raise RuntimeError(f"{proc.name} could not be restarted")

    def remount(self, f: Fault) -> None:
        """Start the killed mount again. A mount may not start while what it needs is down (a
        spoke restarted while the hub is away cannot answer for the repository): then it is
        tried again a few seconds later, after the other faults due meanwhile are recovered
        (blocking here would keep a killed hub down), for up to 120 s."""
        mount = self.dep.mounts[f.target]
        first = getattr(f, "_first_remount", None) or time.monotonic()
        try:
            mount.force_unmount()
            mount.start()
            return
        except Exception as exc:
            if time.monotonic() - first > 120:
                raise
            self.log(f"remount {mount.name}: {exc!r}; again after the faults due meanwhile")
        f._first_remount = first  # type: ignore[attr-defined]
        with self.lock:
            self.n += 1
            heapq.heappush(self.active, (time.monotonic() + 3, self.n, f))

    # -- corruption ------------------------------------------------------------------------
    def check_hub_fsck_finds(self, cid: bytes) -> None:
        """With a pack byte flipped, a deep fsck of the hub must name that chunk, and only it."""
        with httpx.Client(timeout=300) as c:
            r = c.post(self.dep.hub_url() + "/api/v1/admin/fsck", params={"deep": "true"},
                       headers={"Authorization": f"Bearer {self.dep.admin_token}"})
        if r.status_code != 200:
            self.findings.append(f"hub fsck during pack-flip answered {r.status_code}: {r.text[:300]}")
            return
        report = r.json()
        problems = report.get("problems", [])
        if not problems or report.get("ok", True):
            self.findings.append(f"hub fsck did not find a flipped byte in chunk {cid.hex()}: {report}")
        elif any(cid.hex() not in p for p in problems):
            self.findings.append(f"hub fsck reported more than the injected damage: {problems[:5]}")
        else:
            self.counts["fsck-found-pack-flip"] += 1

    def flip_cache(self, f: Fault) -> bool:
        s = self.spoke(f.target)
        present = [c for c in self.victim_chunks if os.path.exists(os.path.join(s.cache, "chunks", c.hex()[:2], c.hex()))]
        if not present:
            return False
        cid = self.rng.choice(present)
        path = os.path.join(s.cache, "chunks", cid.hex()[:2], cid.hex())
        size = os.path.getsize(path)
        if size < 16:
            return False
        at = self.rng.randrange(size // 4, size - 4)
        flip(path, at)
        with open(path, "rb") as fh:
            f._undo = (path, fh.read(), cid)  # type: ignore[attr-defined]
        f.detail = f"{path}@{at}"
        return True

    def check_spoke_fsck_finds(self, f: Fault) -> None:
        """The damaged cache file must be gone (dropped on a read) or reported by the spoke's fsck."""
        path, damaged, cid = f._undo  # type: ignore[attr-defined]
        s = self.spoke(f.target)
        # The spoke checks the admin token with the hub: just after a hub fault it may answer
        # 503 for a while (a documented answer), so the check is asked again until it runs.
        deadline = time.monotonic() + 90
        with httpx.Client(timeout=120) as c:
            while True:
                try:
                    r = c.post(s.proc.url + "/api/v1/admin/fsck", headers={"Authorization": f"Bearer {self.dep.admin_token}"})
                except httpx.HTTPError as exc:
                    r, error = None, repr(exc)
                else:
                    error = f"{r.status_code} {r.text[:200]}"
                if r is not None and r.status_code == 200:
                    break
                if time.monotonic() > deadline:
                    self.findings.append(f"spoke fsck on {s.name} did not run within 90 s: {error}")
                    return
                time.sleep(2)
        report = r.json()
        mentioned = any(cid.hex() in p for p in report.get("problems", []))
        still = False
        with contextlib.suppress(OSError), open(path, "rb") as fh:
            still = fh.read() == damaged
        if mentioned or not still:
            self.counts["cache-flip-detected"] += 1
        else:
            self.findings.append(f"spoke {s.name} kept a damaged cache file {path} and its fsck said {report}")
