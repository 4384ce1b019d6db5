"""Run one soak: set up, load, inject, check at checkpoints and at the end, report.

    from tests.chaos.soak import Config, run
    report = run(Config(seed=7, seconds=180, workdir="/tmp/soak"))
    assert report["passed"], report["problems"]
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import sqlite3
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import httpx

from fabric.client.http import HttpPlane
from tests.chaos.deploy import Deployment, Mount, hub_proc, spoke_node
from tests.chaos.faults import Injector
from tests.chaos.ledger import ABSENT, Ledger, digest
from tests.chaos.workload import HANG_S, REPO, VICTIM, MountWriter, Reader, Rest, RestCommitter, S3Client, read_value

RSS_BOUND = 1 << 30  # bytes; see docs/chaos.md
DRAIN_S = 180.0


@dataclass
class Config:
    seed: int = 1
    seconds: float = 180.0
    workdir: str = "/tmp/fabric-chaos"
    postgres: bool = False  # two hub processes on one PostgreSQL catalog and one store
    checkpoint_every: float = 60.0
    fault_scale: float = 1.0  # multiplies the gaps between faults
    mounts: bool = True
    verbose: bool = True
    extra: dict = field(default_factory=dict)


class Sampler(threading.Thread):
    """RSS and open fds of every server and mount process, once a second; and a watchdog over
    client calls that have run past HANG_S."""

    def __init__(self, dep: Deployment, clients: list, ledger: Ledger, stop: threading.Event) -> None:
        super().__init__(name="chaos-sampler", daemon=True)
        self.dep, self.clients, self.ledger, self.stop_event = dep, clients, ledger, stop
        self.stats: dict[str, dict] = {}
        self.flagged: set[tuple[str, float]] = set()

    def sample(self) -> None:
        import psutil

        for name, p in self.dep.processes().items():
            pid = p.pid
            if not pid or getattr(p, "paused", False):
                continue
            try:
                proc = psutil.Process(pid)
                if proc.status() == psutil.STATUS_ZOMBIE:  # killed, not yet reaped
                    continue
                rss, fds = proc.memory_info().rss, proc.num_fds()
            except (psutil.Error, OSError):
                continue
            s = self.stats.setdefault(name, {"rss_max": 0, "fds_max": 0, "fds_base": {}, "over": []})
            s["rss_max"] = max(s["rss_max"], rss)
            s["fds_max"] = max(s["fds_max"], fds)
            inc = p.incarnation
            if time.monotonic() - p.started_at > 5 and inc not in s["fds_base"]:
                s["fds_base"][inc] = fds
            base = s["fds_base"].get(inc)
            if base is not None and fds > 2 * base + 50:
                s["over"].append(f"{fds} fds (start {base})")
            if rss > RSS_BOUND:
                s["over"].append(f"RSS {rss >> 20} MiB")

    def run(self) -> None:
        while not self.stop_event.wait(1.0):
            self.sample()
            now = time.monotonic()
            for c in self.clients:
                since = c.busy_since
                if since is not None and now - since > HANG_S and (c.client, since) not in self.flagged:
                    self.flagged.add((c.client, since))
                    self.ledger.hangs.append(f"{c.client}: {c.busy_what} still running after {now - since:.0f}s")


class Soak:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.ledger = Ledger()
        self.t_start = time.monotonic()
        self.stack = contextlib.ExitStack()
        self.problems: list[str] = []
        self.checkpoints: list[dict] = []
        self.fsck: dict[str, object] = {}
        self.victim: dict[str, bytes] = {}

    def log(self, msg: str) -> None:
        if self.cfg.verbose:
            print(f"[chaos {time.monotonic() - self.t_start:7.1f}s] {msg}", flush=True)

    # -- set-up ----------------------------------------------------------------------------
    def deploy(self) -> Deployment:
        cfg, wd = self.cfg, self.cfg.workdir
        db = store = None
        if cfg.postgres:
            from tests.pgserver import fresh_database, start_postgres

            server = self.stack.enter_context(start_postgres())
            db = fresh_database(server, prefix="chaos")
            store = "file://" + os.path.join(wd, "store")
        names = ["hub-0", "hub-1"] if cfg.postgres else ["hub-0"]
        hubs = [hub_proc(n, os.path.join(wd, n), db, store) for n in names]
        for h in hubs:
            h.start()
            self.stack.callback(h.stop)
        admin = open(os.path.join(wd, "hub-0", "admin.token")).read().strip()
        dep = Deployment(hubs, [], admin, [os.path.join(wd, n) for n in names], db, store)
        plane = HttpPlane(hubs[0].url, admin)
        plane.create_repo(REPO)
        for b in ("mw", "s3", "rc0", "rc1", "rc2"):
            plane.create_branch(REPO, b, "main")
        plane.create_repo(VICTIM)
        rng = random.Random(cfg.seed ^ 0x51C7)
        self.victim = {f"v{i}.bin": rng.randbytes(rng.randint(40_000, 200_000)) for i in range(6)}
        for path, data in self.victim.items():
            plane.put_object(VICTIM, "main", path, io.BytesIO(data))
        plane.commit(VICTIM, "main", "victim")
        self.victim_chunks = [c for p in self.victim for c, _ in plane.stat_chunks(VICTIM, "main", p).chunks]
        self.victim_locations = self.locate(dep, self.victim_chunks)
        spoke_tok = plane.create_token("chaos-spoke", roles={"*": "write"}, rights=["spoke"])["token"]
        self.client_creds = plane.create_token("chaos-client", roles={REPO: "write", VICTIM: "read"})
        self.client_token = self.client_creds["token"]
        for i, name in enumerate(("spoke-a", "spoke-b")):
            node = spoke_node(name, wd, hubs, spoke_tok, "chaos", small_disk=(i == 0))
            dep.spokes.append(node)
            for link in node.links:
                self.stack.callback(link.stop)
            if node.disk is not None:
                self.stack.callback(node.disk.release)
            node.proc.start()
            self.stack.callback(node.proc.stop)
        for node in dep.spokes:  # the victim's chunks in every spoke's cache
            rest = Rest(node.proc.url, self.client_token)
            for path in self.victim:
                assert rest.get(VICTIM, "main", path).content == self.victim[path]
            rest.close()
        if cfg.mounts:
            opts = ["--server-timeout", "20", "--memory-cache", "32M", "--stats-interval", "0", "--log-level", "warning"]
            a, b = dep.spokes[0].proc.url, dep.spokes[1].proc.url
            dep.mounts["mount-rw"] = Mount("mount-rw", a, f"{REPO}@mw", os.path.join(wd, "mnt-rw"), self.client_token,
                                           [*opts, "--rw", "--durability", "local"])
            dep.mounts["mount-ro"] = Mount("mount-ro", b, f"{REPO}@rc1", os.path.join(wd, "mnt-ro"), self.client_token,
                                           opts)
            for m in dep.mounts.values():
                m.start()
                self.stack.callback(m.stop)
        self.log(f"deployed: hubs {[h.url for h in hubs]}, spokes {[s.proc.url for s in dep.spokes]}, "
                 f"small disk: {dep.spokes[0].disk is not None}, mounts: {sorted(dep.mounts)}")
        return dep

    def locate(self, dep: Deployment, cids: list[bytes]) -> list[tuple[str, int, int, bytes]]:
        """(pack file, offset, length, chunk id) of each victim chunk, from the catalog."""
        rows = []
        if dep.db:
            import psycopg

            with psycopg.connect(dep.db) as conn:
                for cid in cids:
                    rows.append((*conn.execute("SELECT pack, off, len FROM chunks WHERE id=%s", (cid,)).fetchone(), cid))
            root = os.path.join(self.cfg.workdir, "store")
        else:
            conn = sqlite3.connect(f"file:{os.path.join(dep.hub_data[0], 'catalog.db')}?mode=ro", uri=True, timeout=30)
            try:
                for cid in cids:
                    rows.append((*conn.execute("SELECT pack, off, len FROM chunks WHERE id=?", (cid,)).fetchone(), cid))
            finally:
                conn.close()
            root = os.path.join(dep.hub_data[0], "store")
        out = []
        for pack, off, length, cid in rows:
            path = os.path.join(root, "packs", pack[:8], pack)
            if os.path.exists(path):
                out.append((path, off, length, cid))
        if not out:
            self.problems.append("could not find the victim's pack files: pack-flip faults are not drawn")
        return out

    # -- the run ---------------------------------------------------------------------------
    def run(self) -> dict:
        cfg = self.cfg
        if os.path.exists(cfg.workdir):
            shutil.rmtree(cfg.workdir, ignore_errors=True)
        os.makedirs(cfg.workdir)
        with self.stack:
            dep = self.dep = self.deploy()
            stop_clients, stop_faults, stop_sampler = threading.Event(), threading.Event(), threading.Event()
            corrupt = threading.Event()
            a, b = dep.spokes
            s, led = cfg.seed, self.ledger
            clients = [
                RestCommitter("rc0", led, s * 100 + 1, stop_clients, [h.url for h in dep.hubs], self.client_token, "rc0",
                              "hub", "hub"),
                RestCommitter("rc1", led, s * 100 + 2, stop_clients, b.proc.url, self.client_token, "rc1", "local", "spoke-b"),
                # (copied to spoke-b before it is acknowledged; refused with 503 while spoke-b is down)
                RestCommitter("rc2", led, s * 100 + 7, stop_clients, a.proc.url, self.client_token, "rc2", "replicated", "spoke-a"),
                S3Client("s3", led, s * 100 + 3, stop_clients, a.s3_url, self.client_creds, "s3", "spoke-a"),
            ]
            if cfg.mounts:
                clients.append(MountWriter("mw", led, s * 100 + 4, stop_clients, dep.mounts["mount-rw"], "mw", "spoke-a"))
            reader_s3 = S3Client("s3-reader", led, s * 100 + 5, stop_clients, a.s3_url, self.client_creds, "s3", "spoke-a")
            clients.append(Reader("reader", led, s * 100 + 6, stop_clients,
                                  {"hub": dep.hub_url(), "spoke-a": a.proc.url, "spoke-b": b.proc.url}
                                  | {f"hub-{i}": h.url for i, h in enumerate(dep.hubs) if i},
                                  self.client_token, reader_s3, dep.mounts.get("mount-ro"), "rc1", self.victim, corrupt))
            sampler = Sampler(dep, clients, led, stop_sampler)
            injector = Injector(dep, s, stop_faults, self.victim_locations, self.victim_chunks, corrupt, self.log,
                                cfg.fault_scale)
            self.injector = injector
            sampler.start()
            for c in clients:
                c.start()
            injector.start()
            end = self.t_start + cfg.seconds
            next_cp = time.monotonic() + cfg.checkpoint_every
            while time.monotonic() < end:
                time.sleep(0.5)
                if time.monotonic() >= next_cp and end - time.monotonic() > cfg.checkpoint_every / 2:
                    self.checkpoint(injector, final=False)
                    next_cp = time.monotonic() + cfg.checkpoint_every
            self.log("stopping faults")
            stop_faults.set()
            injector.join(120)
            injector.heal_all()
            self.log("stopping clients")
            stop_clients.set()
            for c in clients:
                c.join(HANG_S + 30)
                if c.is_alive():
                    led.hangs.append(f"{c.client} did not stop within {HANG_S + 30:.0f}s ({c.busy_what})")
            self.checkpoint(injector, final=True)
            sampler.sample()
            stop_sampler.set()
            sampler.join(10)
            return self.report(sampler, injector)

    # -- checks ----------------------------------------------------------------------------
    def pending(self) -> dict[str, int]:
        out = {}
        for s in self.dep.spokes:
            with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                r = httpx.get(s.proc.url + "/api/v1/stats", headers={"Authorization": f"Bearer {self.dep.admin_token}"},
                              timeout=30)
                out[s.name] = r.json()["writeback_pending"]
        return out

    def checkpoint(self, injector: Injector, final: bool) -> None:
        """Heal every fault, let the spokes' backlogs drain, then: every acknowledged write is at
        the hub (and, at the end, at the spoke it was written through), fsck is clean everywhere."""
        name = "final" if final else f"checkpoint {len(self.checkpoints) + 1}"
        self.log(f"{name}: healing faults")
        injector.paused.set()
        time.sleep(1.0)
        injector.heal_all()
        t_cut = time.monotonic()
        cp = {"name": name, "at_s": round(t_cut - self.t_start, 1)}
        hub = Rest(self.dep.hub_url(), self.dep.admin_token)
        places = {"hub": hub} | {s.name: Rest(s.proc.url, self.dep.admin_token) for s in self.dep.spokes}
        deadline = time.monotonic() + DRAIN_S
        todo = self.ledger.keys()
        bad: dict = {}
        while True:
            bad = {}
            for key in todo:
                homes = ["hub"] + ([self.ledger.history(key)[0].home] if final else [])
                for where in dict.fromkeys(homes):
                    if where not in places:
                        continue
                    t0 = time.monotonic()
                    try:
                        got = read_value(places[where].get(*key))
                    except httpx.HTTPError as exc:
                        got = None
                        bad[key] = f"{where}: {exc!r}"
                    if got is None:
                        bad.setdefault(key, f"{where}: error")
                        continue
                    ok, late = self.ledger.allowed(key, t_cut if not final else t0, time.monotonic(), strict=True)
                    if got not in ok | late:
                        bad[key] = f"{where}: {got[:12]} not in {sorted(v[:12] for v in ok)}"
            todo = list(bad)
            if not bad or time.monotonic() > deadline:
                break
            time.sleep(2.0)
        cp["keys_checked"] = len(self.ledger.keys())
        cp["drain_s"] = round(time.monotonic() - t_cut, 1)
        cp["pending_after"] = self.pending()
        for key, why in bad.items():
            self.ledger.violation("lost_writes", f"{name}: {key} {why}")
        cp["lost"] = len(bad)
        if final:
            cp["history"] = self.check_history(hub)
        cp["fsck"] = self.run_fsck()
        for r in places.values():
            r.close()
        self.checkpoints.append(cp)
        self.log(f"{name}: {cp}")
        injector.paused.clear()

    def run_fsck(self) -> dict:
        out = {}
        targets = [("hub", self.dep.hub_url())] + [(s.name, s.proc.url) for s in self.dep.spokes]
        for name, url in targets:
            try:
                r = httpx.post(url + "/api/v1/admin/fsck", params={"deep": "true"}, timeout=600,
                               headers={"Authorization": f"Bearer {self.dep.admin_token}"})
                rep = r.json() if r.status_code == 200 else {"ok": False, "problems": [f"HTTP {r.status_code}: {r.text[:300]}"]}
            except httpx.HTTPError as exc:
                rep = {"ok": False, "problems": [repr(exc)]}
            out[name] = {"ok": bool(rep.get("ok")), "problems": rep.get("problems", [])[:10]}
            if not rep.get("ok"):
                self.problems.append(f"fsck of {name} not clean: {rep.get('problems', [])[:5]}")
        return out

    def check_history(self, hub: Rest) -> dict:
        """Branch histories at the hub are linear and hold every acknowledged commit, in order;
        acknowledged tags point at their commits; paths at acknowledged commits hold what the
        ledger allowed when they were made."""
        led = self.ledger
        out = {"commits_acked": 0, "commits_unknown_landed": 0, "commit_reads": 0}
        by_branch: dict[str, list] = {}
        for rec in led.commits:
            by_branch.setdefault(rec.branch[1], []).append(rec)
        for branch, recs in by_branch.items():
            log, after = [], None
            while True:
                r = hub.http.get(f"/repos/{REPO}/refs/{branch}/log", params={"limit": 1000, **({"after": after} if after else {})})
                r.raise_for_status()
                page = r.json()
                log += page["commits"]
                after = page["next_after"]
                if not after:
                    break
            for i, c in enumerate(log):
                want = [log[i + 1]["id"]] if i + 1 < len(log) else []
                if c["parents"] != want and not (i + 1 == len(log) and len(c["parents"]) == 0):
                    led.violation("history", f"{branch}: commit {c['id']} has parents {c['parents']}, expected {want}")
            position = {c["id"]: i for i, c in enumerate(log)}
            tokens = {c["meta"].get("chaos-op"): c["id"] for c in log}
            last = len(log)
            for rec in recs:
                if rec.status == "ok":
                    out["commits_acked"] += 1
                    if rec.id not in position:
                        led.violation("lost_writes", f"acknowledged commit {rec.id} is not in {branch}'s history")
                        continue
                    if position[rec.id] >= last:
                        led.violation("history", f"{branch}: commit {rec.id} is out of acknowledgement order")
                    last = position[rec.id]
                elif rec.token in tokens:
                    out["commits_unknown_landed"] += 1
                    rec.id = tokens[rec.token]
        r = hub.http.get(f"/repos/{REPO}/tags")
        tags = {t["name"]: t["commit_id"] for t in r.json()} if r.status_code == 200 else {}
        for rec in led.commits:
            if rec.tag and rec.tag_status == "ok" and tags.get(rec.tag) != rec.id:
                led.violation("lost_writes", f"acknowledged tag {rec.tag} -> {tags.get(rec.tag)}, expected {rec.id}")
        rng = random.Random(self.cfg.seed)
        acked = [c for c in led.commits if c.status == "ok" and c.snapshot]
        sample = [(c, p) for c in acked[-5:] for p in sorted(c.snapshot)]
        pairs = [(c, p) for c in acked for p in c.snapshot]
        sample += rng.sample(pairs, min(200, len(pairs)))
        for rec, path in sample:
            got = read_value(hub.get(REPO, rec.id, path))
            out["commit_reads"] += 1
            if got is None or got not in rec.snapshot[path]:
                led.violation("lost_writes", f"commit {rec.id} {path}: {got and got[:12]} not in snapshot")
        return out

    # -- the report ------------------------------------------------------------------------
    def report(self, sampler: Sampler, injector: Injector) -> dict:
        led = self.ledger
        resources = {}
        for name, s in sorted(sampler.stats.items()):
            resources[name] = {"rss_max_mib": round(s["rss_max"] / 2**20, 1), "fds_max": s["fds_max"],
                               "fds_start": min(s["fds_base"].values()) if s["fds_base"] else None,
                               "over_bound": s["over"][:3]}
            if s["over"]:
                self.problems.append(f"{name} went over its resource bound: {s['over'][:3]}")
        statuses = Counter(op.status for op in led.ops)
        counts = led.counts
        report = {
            "seed": self.cfg.seed,
            "seconds": round(time.monotonic() - self.t_start, 1),
            "configuration": "postgres, 2 hubs" if self.cfg.postgres else "sqlite, 1 hub",
            "ops": dict(sorted(led.ops_done.items())),
            "faults": {k: v for k, v in sorted(injector.counts.items())},
            "acknowledged_writes": led.acked(),
            "write_outcomes": dict(statuses),
            "commits": dict(Counter(c.status for c in led.commits)),
            "reads_checked": dict(led.reads),
            "lost_writes": counts["lost_writes"],
            "wrong_reads": counts["wrong_reads"],
            "stale_reads": counts["stale_reads"],
            "history_violations": counts["history"],
            "conditional_violations": counts["conditional"],
            "late_unknown_writes_seen": counts["late_unknown"],
            "mount_reads_within_name_cache_lag": counts["lagged_reads"],
            "mount_name_cache_lag_max_s": round(led.lag_max, 2),
            "tags_not_yet_seen": counts["tags_not_yet_seen"],
            "tags_not_yet_seen_max_age_s": round(led.tag_unseen_max, 2),
            "undocumented_errors": len(led.undocumented),
            "hangs": len(led.hangs),
            "longest_stall_s": round(led.longest_stall[0], 2),
            "longest_stall_op": led.longest_stall[1],
            "client_errors": dict(sorted(led.errors.items())),
            "resources": resources,
            "checkpoints": self.checkpoints,
            "fault_findings": injector.findings,
            "violations": led.violations[:50],
            "undocumented": led.undocumented[:50],
            "hang_list": led.hangs[:20],
            "fault_log": injector.history,
        }
        problems = list(self.problems)
        for k in ("lost_writes", "wrong_reads", "stale_reads", "history_violations", "conditional_violations",
                  "undocumented_errors", "hangs"):
            if report[k]:
                problems.append(f"{k}: {report[k]}")
        problems += [f"fault: {f}" for f in injector.findings]
        report["problems"] = problems
        report["passed"] = not problems
        return report


def run(cfg: Config) -> dict:
    return Soak(cfg).run()


def table(report: dict) -> str:
    """The report as a plain-text table."""
    rows = [("seed", report["seed"]), ("configuration", report["configuration"]), ("seconds", report["seconds"])]
    rows += [(f"ops {k}", v) for k, v in report["ops"].items()]
    rows += [(f"faults {k}", v) for k, v in report["faults"].items()]
    rows += [("acknowledged writes", report["acknowledged_writes"]),
             ("write outcomes", ", ".join(f"{k} {v}" for k, v in report["write_outcomes"].items())),
             ("reads checked", sum(report["reads_checked"].values())),
             ("lost writes", report["lost_writes"]), ("wrong reads", report["wrong_reads"]),
             ("stale reads", report["stale_reads"]),
             ("ro-mount reads within its name cache lag",
              f"{report['mount_reads_within_name_cache_lag']} (at most {report['mount_name_cache_lag_max_s']} s behind)"),
             ("tags not yet seen at a spoke", f"{report['tags_not_yet_seen']} (at most {report['tags_not_yet_seen_max_age_s']} s after the tag)"),
             ("history violations", report["history_violations"]),
             ("conditional violations", report["conditional_violations"]),
             ("undocumented errors", report["undocumented_errors"]), ("hangs", report["hangs"]),
             ("longest client stall", f"{report['longest_stall_s']} s ({report['longest_stall_op']})")]
    for name, r in report["resources"].items():
        rows.append((f"{name} RSS / fds max", f"{r['rss_max_mib']} MiB / {r['fds_max']} (start {r['fds_start']})"))
    rows.append(("passed", report["passed"]))
    width = max(len(str(k)) for k, _ in rows)
    lines = [f"{str(k):<{width}}  {v}" for k, v in rows]
    if report["problems"]:
        lines += ["", "problems:"] + [f"  {p}" for p in report["problems"][:40]]
        lines += [f"  {v}" for v in report["violations"][:20]]
    return "\n".join(lines)


def save(report: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(report, f, indent=1, default=str)


__all__ = ["Config", "run", "table", "save", "asdict", "ABSENT", "digest"]
