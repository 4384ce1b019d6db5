#!/usr/bin/env python3
"""Checkpoint writes without stalling training (issues 5, 16): a spoke mount over a WAN vs rclone mount vs local disk.

What: the time a training job waits for a checkpoint ("stall"), and the time
until the checkpoint is safe at the hub ("at hub"), when it is written through
a ``fabric mount --rw`` of a spoke that reaches its hub over an emulated WAN.

Why: with ``--durability local`` fsync returns once the spoke's disk holds the
data and the spoke pushes it to the hub in the background, so training should
stall about as long as it would on a local disk, while the push to the hub
runs at the speed of the link. ``--durability hub`` is the synchronous
alternative; ``rclone mount --vfs-cache-mode writes`` of the hub's S3 gateway
(rclone's own write-back cache, across the same WAN) is the peer.

Setup (one run): ``fabric hub --s3-listen`` on loopback; two in-process
:class:`testbed.wanproxy.WanProxy` links with the same RTT and rate (default
50 ms, 200 Mbit/s each way), one in front of the hub's REST port, one in front
of its S3 port; two spokes ``fabric spoke --hub PROXY --cache-size 4GiB
--peers A,B`` (a static group: the second keeps the copies of writes made with
``replicated`` durability). One repository per system, branch ``main``.

The workload, the same for every system: ``--shards`` files of ``--shard-mib``
MiB of fresh random bytes (new bytes for every system and round, so no system
gains from deduplication), written by one thread each in 4 MiB ``write()``
calls, each thread fsyncs and closes its file; then a small ``.metadata.tmp``
is written, fsynced, and renamed over ``.metadata`` (what
torch.distributed.checkpoint's FileSystemWriter does). Each round writes into a
fresh ``step-<round>`` directory, which is created before the clock starts.

Systems (order rotating round by round):

- ``fabric-local``: ``fabric mount SPOKE repo@main MNT --rw --durability local``
  (files written in order are chunked and sent while they are written)
- ``fabric-writeback``: ``--durability local --writeback`` (fsync returns once
  the file is in the mount's ``--write-dir`` on this machine's disk, journaled;
  the mount chunks and stages it on the spoke in the background after its close)
- ``fabric-writeback-replicated``: ``--durability replicated --writeback`` (fsync
  returns once the file is journaled on this machine's disk and the peer spoke
  keeps a copy of it on its disk: fuse/mirror.py; staged at ``replicated`` after)
- ``fabric-writeback-tagged``: ``fabric-writeback`` with ``--commit-checkpoints``
  (the rename of ``.metadata`` has the mount commit the step and tag it
  ``main.step-N`` in the background); its extra figure is the time until that
  tag is at the hub, i.e. until ``fabric checkpoints`` lists the step
- ``fabric-local-whole``: the same with ``--no-stream-writes`` (each file
  chunked at its fsync: the behaviour before streaming, for an A/B in one run)
- ``fabric-replicated``: ``--durability replicated`` (fsync returns once the
  spoke and its peer spoke both hold the data)
- ``fabric-hub``: the same with ``--durability hub``
- ``rclone``: ``rclone mount wan:repo/main MNT --vfs-cache-mode writes
  --vfs-write-back 1s`` through the second WAN link: close returns once
  rclone's local cache has the file (rclone mount answers FUSE fsync without
  doing anything, so not even that cache is on disk), and the upload starts 1 s later rather
  than after rclone's default 5 s hold, which would only add to its figure.
  With 0 s, rclone 1.60 starts uploading ``.metadata.tmp`` before the rename
  arrives, then fails ("corrupted on transfer: md5 hash differ") and
  ``.metadata`` never reaches the remote; a hold of 1 s lets the rename win.
- ``s3fs``: ``s3fs repo:/main MNT -o url=WAN -o use_path_request_style -o
  use_cache=DIR`` (s3fs-fuse, as its users run it against an S3-compatible store;
  its defaults otherwise: 10 MiB multipart parts, 5 in parallel) through the same
  link as rclone: it uploads a file at its flush (fsync, close), so the writer
  waits for the upload. At hub as for rclone.
- ``local-disk``: a plain directory on the same disk (the floor)

Figures per round:

- stall: wall seconds from the first write until the rename returns;
- at hub: seconds from the first write until the hub holds the checkpoint.
  fabric-local: the spoke's ``GET /api/v1/stats`` reports
  ``writeback_pending == 0`` (polled every 0.1 s; fabric-writeback: and its
  mount's journal holds no record); fabric-hub: equal to the
  stall (fsync returns only once the hub has the data); rclone: every shard
  and ``.metadata`` answer a HEAD with their size on the hub's S3 port
  (directly, not through the WAN) and ``.metadata.tmp`` does not.

Restore (each round, fabric-local, fabric-writeback and local-disk): the page
cache dropped, every shard read back by one thread each and checked;
fabric-local through a read-only mount of the checkpoint's commit on the spoke
that wrote it (warm) and on a third spoke in no group (cold: over the WAN);
fabric-writeback, whose mount runs with ``--seed-copies DIR``, through a
``--passthrough`` mount of the commit with ``--cache-dir DIR`` (a restore on the
machine that saved it: the kernel reads the copies the writer left). With
``--spoke-seed-copies`` the spoke runs with ``--seed-copies DIR`` and fabric-local
is also restored through a ``--passthrough`` mount with ``--copies-dir DIR``
(a restore beside the warm spoke: the kernel reads the copies the spoke left).

After each round the checkpoint is committed at the hub and every file read
back from that commit (or, for local-disk, from the directory) and compared by
sha256 with what was written: a round that stored wrong bytes stops the run.

Dedup rounds (after the timed rounds, fabric-local and rclone): checkpoint N of
fresh bytes, then N+1 as a frozen-backbone step (each shard is 16 equal
"tensors"; the last ``--changed-tensors`` of them, default 2, are new bytes, the
rest unchanged) and as a full fine-tuning step (all 16 new): the bytes sent over
the WAN and stored at the hub, against the bytes that changed.

    python bench/bench_checkpoint.py                                  # 4 x 64 MiB, 3 rounds (~6 min on 2 CPUs)
    python bench/bench_checkpoint.py --shards 2 --shard-mib 8 --runs 1   # smoke test
    python bench/bench_checkpoint.py --json-out r.json --md-out r.md

Needs root or user FUSE (``/dev/fuse``, ``fusermount3``) and ``rclone`` on PATH (``s3fs``, from
Debian's s3fs package, for its row).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _common import FABRIC_SRC, MB, drop_page_cache, fabric_env, machine, median, remove, save_report, stop_process, unmount

# testbed/ (and bench_s3's fabric imports) from the revision measured: the working tree, or run_all.sh --rev's snapshot.
sys.path.insert(0, FABRIC_SRC)
from bench_s3 import start_hub, start_spoke

from testbed.wanproxy import WanProxy

MiB = 1024 * 1024
WRITE_SIZE = 4 * MiB
POLL_S = 0.1
META_TMP, META = ".metadata.tmp", ".metadata"
SYSTEMS = ("fabric-local", "fabric-writeback", "fabric-writeback-replicated", "fabric-writeback-tagged", "fabric-local-whole",
           "fabric-replicated", "fabric-hub", "rclone", "s3fs", "local-disk")
#: Tensors per shard in the dedup rounds; a frozen-backbone step changes ``--changed`` of them.
TENSORS = 16


# -- the workload ----------------------------------------------------------------------------
@dataclass
class Checkpoint:
    """One checkpoint's bytes, generated before the clock starts."""

    shards: dict[str, bytes]
    metadata: bytes
    digests: dict[str, str] = field(default_factory=dict)

    @classmethod
    def fresh(cls, n: int, size: int, tag: str) -> Checkpoint:
        shards = {f"__{i}_0.distcp": os.urandom(size) for i in range(n)}
        meta = json.dumps({"tag": tag, "shards": {k: len(v) for k, v in shards.items()}}).encode()
        ckpt = cls(shards, meta)
        ckpt.digests = {name: sha256(data) for name, data in ckpt.files().items()}
        return ckpt

    def files(self) -> dict[str, bytes]:
        """What the directory holds once the checkpoint is complete."""
        return {**self.shards, META: self.metadata}

    @property
    def shard_bytes(self) -> int:
        return sum(len(v) for v in self.shards.values())

    def next_step(self, changed: int, tag: str) -> tuple[Checkpoint, int]:
        """Step N+1 of a fine-tune that updates ``changed`` of each shard's :data:`TENSORS`
        equal tensors (a frozen backbone with trained adapters; all of them: full fine-tuning),
        the others byte for byte the same; and how many bytes changed."""
        shards, diff = {}, 0
        for name, data in self.shards.items():
            size = len(data) // TENSORS
            parts = [data[i * size : (i + 1) * size] for i in range(TENSORS)] + [data[TENSORS * size :]]
            for i in range(TENSORS - changed, TENSORS):  # the head and adapters sit last, as in most state dicts
                parts[i] = os.urandom(size)
                diff += size
            shards[name] = b"".join(parts)
        meta = json.dumps({"tag": tag, "shards": {k: len(v) for k, v in shards.items()}}).encode()
        ckpt = Checkpoint(shards, meta)
        ckpt.digests = {name: sha256(data) for name, data in ckpt.files().items()}
        return ckpt, diff


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_synced(path: str, data: bytes) -> None:
    """Create ``path``, write ``data`` in WRITE_SIZE calls, fsync, close."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        done = 0
        while done < len(view):
            done += os.write(fd, view[done : done + WRITE_SIZE])
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(directory: str, ckpt: Checkpoint) -> tuple[float, float]:
    """Write the checkpoint as torch.distributed.checkpoint does; ``(t0, stall seconds)``."""
    names = list(ckpt.shards)
    with ThreadPoolExecutor(len(names)) as pool:
        t0 = time.perf_counter()
        list(pool.map(lambda n: write_synced(os.path.join(directory, n), ckpt.shards[n]), names))
    write_synced(os.path.join(directory, META_TMP), ckpt.metadata)
    os.rename(os.path.join(directory, META_TMP), os.path.join(directory, META))
    return t0, time.perf_counter() - t0


def read_checkpoint(directory: str, ckpt: Checkpoint) -> float:
    """Read every shard, one thread each (as the ranks of a restore do), and check its sha256; seconds."""
    names = list(ckpt.shards)

    def read(name: str) -> None:
        with open(os.path.join(directory, name), "rb", buffering=0) as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        if digest != ckpt.digests[name]:
            raise SystemExit(f"DATA MISMATCH on restore: {directory}/{name}")

    drop_page_cache()
    with ThreadPoolExecutor(len(names)) as pool:
        t0 = time.perf_counter()
        list(pool.map(read, names))
        return time.perf_counter() - t0


def wait_until(done: Callable[[], bool], t0: float, timeout: float, what: str, log: str) -> float:
    """Seconds from ``t0`` until ``done()`` holds (polled every POLL_S); gives up after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}; the end of {log}:\n{tail(log)}")
        time.sleep(POLL_S)
    return time.perf_counter() - t0


def push_timeout(ckpt: Checkpoint, rate_mbit: float) -> float:
    """Generous bound on a push to the hub: 10x the checkpoint's time at the WAN's rate, at least 2 minutes."""
    return max(120.0, 10 * ckpt.shard_bytes / (rate_mbit * 125_000))


# -- the hub ---------------------------------------------------------------------------------
class Hub:
    """REST calls straight to the hub (loopback, not through the WAN), as its admin."""

    def __init__(self, url: str, token: str) -> None:
        import httpx

        self.http = httpx.Client(base_url=url + "/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=120)

    def create_repo(self, name: str) -> None:
        self.http.post("/repos", json={"name": name, "default_branch": "main"}).raise_for_status()

    def s3_keys(self) -> tuple[str, str]:
        r = self.http.post("/tokens", json={"name": "bench-checkpoint-rclone", "admin": True})
        r.raise_for_status()
        return r.json()["s3_access_key_id"], r.json()["s3_secret_access_key"]

    def commit(self, repo: str, message: str) -> str:
        # (allow_empty: a mount with --commit-checkpoints has committed the checkpoint itself)
        r = self.http.post(f"/repos/{repo}/branches/main/commits", json={"message": message, "allow_empty": True})
        r.raise_for_status()
        return r.json()["id"]

    def exists(self, repo: str, ref: str, path: str) -> bool:
        r = self.http.get(f"/repos/{repo}/refs/{ref}/stat", params={"path": path})
        if r.status_code == 404:
            return False
        r.raise_for_status()
        return True

    def digest(self, repo: str, ref: str, path: str) -> str:
        h = hashlib.sha256()
        with self.http.stream("GET", f"/repos/{repo}/refs/{ref}/objects", params={"path": path}) as r:
            r.raise_for_status()
            for piece in r.iter_bytes(1 << 20):
                h.update(piece)
        return h.hexdigest()

    def verify(self, repo: str, directory: str, ckpt: Checkpoint) -> str:
        """Commit the branch, then check every file of the checkpoint at that commit; the commit id."""
        commit = self.commit(repo, f"bench checkpoint {directory}")
        for name, want in ckpt.digests.items():
            got = self.digest(repo, commit, f"{directory}/{name}")
            if got != want:
                raise SystemExit(f"DATA MISMATCH at the hub: {repo}@{commit}:{directory}/{name} sha256 {got}, wrote {want}")
        if self.exists(repo, commit, f"{directory}/{META_TMP}"):
            raise SystemExit(f"{repo}@{commit}:{directory}/{META_TMP} is still there after the rename")
        return commit

    def tags(self, repo: str) -> set[str]:
        r = self.http.get(f"/repos/{repo}/tags")
        r.raise_for_status()
        return {t["name"] for t in r.json()}

    def stored_bytes(self) -> int:
        r = self.http.get("/stats")
        r.raise_for_status()
        return int(r.json()["stored_bytes"])

    def close(self) -> None:
        self.http.close()


def tail(path: str, n: int = 3000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return "(no log)"


# -- systems ---------------------------------------------------------------------------------
@dataclass
class Env:
    """What the systems share: the servers, their URLs and credentials, the work directory."""

    python: str
    work: str
    hub: Hub
    hub_s3: str
    spoke_url: str
    cold_spoke_url: str  # a spoke that restores each checkpoint without having seen it
    token: str
    s3_keys: tuple[str, str]
    wan_rest: WanProxy  # in front of the hub's REST port: the spoke's link
    wan_s3: WanProxy  # in front of the hub's S3 port: rclone's link
    rate_mbit: float
    rclone_write_back: str
    spoke_seeds: str | None = None  # --spoke-seed-copies: the spoke's --seed-copies DIR


class System:
    """A place to write a checkpoint to; mounted for one round at a time."""

    name = ""
    root = ""

    def mount(self) -> None: ...

    def unmount(self) -> dict:
        return {}

    def wan_bytes_up(self) -> int | None:
        return None

    def at_hub(self, directory: str, ckpt: Checkpoint, t0: float, stall: float) -> float | None:
        return None

    def round_figures(self) -> dict:
        """Figures of its own the system measured in the round just written (``at_hub`` sets them)."""
        return {}

    def verify(self, directory: str, ckpt: Checkpoint) -> str:
        raise NotImplementedError

    def restore(self, directory: str, ckpt: Checkpoint, verified: str) -> dict:
        """Seconds to read the checkpoint back (``restore_warm_s``, ``restore_cold_s``), where measured."""
        return {}

    def describe(self) -> str:
        raise NotImplementedError


class FabricMount(System):
    def __init__(self, env: Env, durability: str, stream: bool = True, writeback: bool = False, tagged: bool = False) -> None:
        """``stream=False``: ``--no-stream-writes`` (each file chunked at fsync, as before streaming);
        ``writeback``: ``--writeback`` (fsync returns once the file is on the mount's disk);
        ``tagged``: ``--commit-checkpoints`` (the rename of ``.metadata`` commits and tags the step)."""
        self.env, self.durability, self.stream, self.writeback, self.tagged = env, durability, stream, writeback, tagged
        if writeback:
            self.name = "fabric-writeback" + ("-replicated" if durability == "replicated" else "") + ("-tagged" if tagged else "")
        else:
            self.name = f"fabric-{durability}" + ("" if stream else "-whole")
        self.repo = f"ckpt-{self.name}"
        base = os.path.join(env.work, self.name)
        self.root, self.log, self.write_dir = f"{base}-mnt", f"{base}.log", f"{base}-writes"
        #: --writeback: the files staged are left as plain copies here, for the restore's --passthrough mount
        self.copies = f"{base}-copies" if writeback and not tagged else None
        self.tagged_s: float | None = None
        self.cli = [env.python, "-m", "fabric.cli.main"]
        env.hub.create_repo(self.repo)

    def mount_cmd(self, token: str) -> list[str]:
        return [*self.cli, "mount", self.env.spoke_url, f"{self.repo}@main", self.root, "--rw", "--durability",
                self.durability, "--token", token, "--write-dir", self.write_dir, "--log-file", self.log,
                *([] if self.stream else ["--no-stream-writes"]), *(["--writeback"] if self.writeback else []),
                *(["--seed-copies", self.copies] if self.copies else []), *(["--commit-checkpoints"] if self.tagged else [])]

    def describe(self) -> str:
        return " ".join(self.mount_cmd("TOKEN")).replace(self.env.python, "python")

    def mount(self) -> None:
        os.makedirs(self.root, exist_ok=True)
        os.makedirs(self.write_dir, exist_ok=True)
        p = subprocess.run(self.mount_cmd(self.env.token), env=fabric_env(), cwd=FABRIC_SRC, capture_output=True, text=True, check=False)
        if p.returncode != 0 or not os.path.ismount(self.root):
            unmount(self.root)
            raise SystemExit(f"fabric mount failed (exit {p.returncode}): {p.stderr[-2000:]}\nlog:\n{tail(self.log)}")

    def unmount(self) -> dict:
        t0 = time.perf_counter()
        subprocess.run([*self.cli, "umount", self.root, "--timeout", "300"], env=fabric_env(), cwd=FABRIC_SRC,
                       capture_output=True, check=False)
        unmount(self.root)
        return {"umount_s": time.perf_counter() - t0}

    def round_figures(self) -> dict:
        tagged, self.tagged_s = self.tagged_s, None
        return {} if tagged is None else {"tagged_s": tagged}

    def wan_bytes_up(self) -> int:
        return self.env.wan_rest.bytes_up

    def parked(self) -> int:
        """Files the mount has not staged yet (``--writeback``: its journal's records)."""
        journal = os.path.join(self.write_dir, "writeback")
        return sum(n.endswith(".json") for n in os.listdir(journal)) if os.path.isdir(journal) else 0

    def pending(self) -> int:
        import httpx

        r = httpx.get(self.env.spoke_url + "/api/v1/stats", headers={"Authorization": f"Bearer {self.env.token}"}, timeout=30)
        r.raise_for_status()
        return int(r.json()["writeback_pending"])

    def at_hub(self, directory: str, ckpt: Checkpoint, t0: float, stall: float) -> float:
        if self.durability == "hub":
            if self.pending():
                raise SystemExit("fabric-hub: the spoke still has writes queued after fsync with --durability hub")
            return stall
        if self.tagged and directory.startswith("step-"):
            tag = f"main.{directory}"
            self.tagged_s = wait_until(lambda: tag in self.env.hub.tags(self.repo), t0, push_timeout(ckpt, self.env.rate_mbit),
                                       f"the tag {tag}", self.log)
        return wait_until(lambda: self.parked() == 0 and self.pending() == 0, t0, push_timeout(ckpt, self.env.rate_mbit), "the spoke's write-back to reach the hub",
                          os.path.join(self.env.work, "spoke.log"))

    def verify(self, directory: str, ckpt: Checkpoint) -> str:
        return self.env.hub.verify(self.repo, directory, ckpt)

    def restore(self, directory: str, ckpt: Checkpoint, verified: str) -> dict:
        """fabric-local: read the commit through a read-only mount of the spoke that wrote it
        (warm: it holds every chunk), the same with the mount reading the spoke's cache files
        (``--spoke-cache``: a mount beside its spoke), and through a mount of a spoke that never
        saw it (cold: every chunk over the WAN). fabric-writeback: through a ``--passthrough``
        mount whose ``--cache-dir`` is the writer's ``--seed-copies`` (a restore on the machine
        that saved it)."""
        if self.copies:
            seeded = ["--passthrough", "--cache-dir", self.copies]
            return {key: self._restore_through(self.env.spoke_url, verified, directory, ckpt, seeded + extra, scrubbed)
                    for key, extra, scrubbed in (("restore_seeded_s", [], False), ("restore_seeded_scrubbed_s", [], True),
                                                 ("restore_seeded_trusted_s", ["--no-passthrough-check"], False))}
        if self.name != "fabric-local":
            return {}
        beside = ["--spoke-cache", os.path.join(self.env.work, "spoke")]
        ways = []
        if self.env.spoke_seeds:  # (a passthrough mount beside the spoke, over the copies it left)
            ways.append(("restore_spoke_seeded_s", self.env.spoke_url,
                         ["--passthrough", "--cache-dir", f"{self.root}-ro-cache", "--copies-dir", self.env.spoke_seeds]))
        ways += [("restore_warm_s", self.env.spoke_url, []), ("restore_warm_files_s", self.env.spoke_url, beside),
                 ("restore_cold_s", self.env.cold_spoke_url, [])]
        return {key: self._restore_through(url, verified, directory, ckpt, extra) for key, url, extra in ways}

    def _restore_through(self, url: str, commit: str, directory: str, ckpt: Checkpoint, extra: list[str],
                         scrubbed: bool = False) -> float:
        """Seconds to read ``ckpt`` back through a read-only mount of ``commit`` from ``url``;
        ``scrubbed``: once the mount's scrub has checked every copy (a mount up for a while)."""
        root = f"{self.root}-ro"
        os.makedirs(root, exist_ok=True)
        cmd = [*self.cli, "mount", url, f"{self.repo}@{commit}", root, "--token", self.env.token, "--log-file", f"{self.log}.ro", *extra]
        p = subprocess.run(cmd, env=fabric_env(), cwd=FABRIC_SRC, capture_output=True, text=True, check=False)
        if p.returncode != 0:
            unmount(root)
            raise SystemExit(f"fabric mount (read-only) failed: {p.stderr[-2000:]}")
        try:
            if scrubbed:
                wait_until(lambda: scrub_done(root), time.perf_counter(), 120, "the mount's scrub of its copies", f"{self.log}.ro")
            return read_checkpoint(os.path.join(root, directory), ckpt)
        finally:
            subprocess.run([*self.cli, "umount", root], env=fabric_env(), cwd=FABRIC_SRC, capture_output=True, check=False)
            unmount(root)


def scrub_done(mountpoint: str) -> bool:
    """Whether a --passthrough mount's scrub has checked every copy (its stats file says so)."""
    from fuse.mount import read_stats

    try:
        copies = read_stats(mountpoint)["kernel"]["copies"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return copies["unchecked"] == 0 and copies["copies"] > 0


class RcloneMount(System):
    name = "rclone"

    def __init__(self, env: Env) -> None:
        import boto3
        from botocore.config import Config

        self.env = env
        self.repo = f"ckpt-{self.name}"
        base = os.path.join(env.work, self.name)
        self.root, self.log, self.cache = f"{base}-mnt", f"{base}.log", f"{base}-cache"
        self.proc: subprocess.Popen | None = None
        env.hub.create_repo(self.repo)
        ak, sk = env.s3_keys
        self.s3 = boto3.client("s3", endpoint_url=env.hub_s3, aws_access_key_id=ak, aws_secret_access_key=sk,
                               region_name="us-east-1",
                               config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))

    def cmd(self) -> list[str]:
        return ["rclone", "mount", f"wan:{self.repo}/main", self.root, "--vfs-cache-mode", "writes",
                "--vfs-write-back", self.env.rclone_write_back, "--s3-no-check-bucket", "--cache-dir", self.cache, "--log-file", self.log]

    def describe(self) -> str:
        return " ".join(self.cmd())

    def mount_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RCLONE_"))}
        ak, sk = self.env.s3_keys
        p = "RCLONE_CONFIG_WAN_"
        env.update({"RCLONE_CONFIG": os.devnull, p + "TYPE": "s3", p + "PROVIDER": "Other", p + "ENV_AUTH": "false",
                    p + "ACCESS_KEY_ID": ak, p + "SECRET_ACCESS_KEY": sk, p + "REGION": "us-east-1",
                    p + "ENDPOINT": self.env.wan_s3.url_for(), p + "FORCE_PATH_STYLE": "true"})
        return env

    def mount(self) -> None:
        remove(self.cache)
        os.makedirs(self.root, exist_ok=True)
        self.proc = subprocess.Popen(self.cmd(), env=self.mount_env(), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not os.path.ismount(self.root):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                rc = self.proc.poll()
                self.unmount()
                raise SystemExit(f"{self.name} mount did not come up (exit {rc}):\n{tail(self.log)}")
            time.sleep(0.1)

    def unmount(self) -> dict:
        """Unmount and wait for rclone to exit (it finishes pending uploads first)."""
        t0 = time.perf_counter()
        if os.path.ismount(self.root):
            subprocess.run(["fusermount3", "-u", self.root], capture_output=True, check=False)
        if self.proc is not None:
            try:
                self.proc.wait(300)
            except subprocess.TimeoutExpired:
                unmount(self.root)
                stop_process(self.proc)
            self.proc = None
        unmount(self.root)
        remove(self.cache)
        return {"umount_s": time.perf_counter() - t0}

    def wan_bytes_up(self) -> int:
        return self.env.wan_s3.bytes_up

    def head_size(self, key: str) -> int | None:
        from botocore.exceptions import ClientError

        try:
            return self.s3.head_object(Bucket=self.repo, Key=f"main/{key}")["ContentLength"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise

    def landed(self, directory: str, ckpt: Checkpoint) -> bool:
        if any(self.head_size(f"{directory}/{n}") != len(d) for n, d in ckpt.files().items()):
            return False
        return self.head_size(f"{directory}/{META_TMP}") is None

    def at_hub(self, directory: str, ckpt: Checkpoint, t0: float, stall: float) -> float:
        return wait_until(lambda: self.landed(directory, ckpt), t0, push_timeout(ckpt, self.env.rate_mbit),
                          f"{self.name}'s uploads to reach the hub", self.log)

    def verify(self, directory: str, ckpt: Checkpoint) -> str:
        return self.env.hub.verify(self.repo, directory, ckpt)


class S3fsMount(RcloneMount):
    """s3fs-fuse, as its users run it against an S3-compatible store: path-style requests, a
    local cache directory, multipart uploads of 10 MiB parts, 5 in parallel (its defaults).
    It uploads a file when it is flushed (close, fsync): the writer waits for the upload."""

    name = "s3fs"

    def cmd(self) -> list[str]:
        return ["s3fs", f"{self.repo}:/main", self.root, "-f", "-o", f"url={self.env.wan_s3.url_for()}", "-o", "use_path_request_style",
                "-o", f"passwd_file={self.log}.passwd", "-o", f"use_cache={self.cache}", "-o", "dbglevel=warn",
                "-o", f"logfile={self.log}"]

    def describe(self) -> str:
        return " ".join(self.cmd())

    def mount_env(self) -> dict[str, str]:
        ak, sk = self.env.s3_keys
        fd = os.open(f"{self.log}.passwd", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"{ak}:{sk}\n")
        return {k: v for k, v in os.environ.items() if not k.startswith("AWS")}


class LocalDisk(System):
    name = "local-disk"

    def __init__(self, env: Env) -> None:
        self.root = os.path.join(env.work, "local-disk")
        os.makedirs(self.root, exist_ok=True)

    def describe(self) -> str:
        return f"(a directory on the same file system: {self.root})"

    def verify(self, directory: str, ckpt: Checkpoint) -> str:
        path = os.path.join(self.root, directory)
        with open(os.path.join(path, META), "rb") as f:
            if hashlib.file_digest(f, "sha256").hexdigest() != ckpt.digests[META]:
                raise SystemExit(f"DATA MISMATCH on local disk: {path}/{META}")
        if os.path.exists(os.path.join(path, META_TMP)):
            raise SystemExit(f"{path}/{META_TMP} is still there after the rename")
        return "ok"

    def restore(self, directory: str, ckpt: Checkpoint, verified: str) -> dict:
        """Read the shards back (checking them) from the disk, the page cache dropped first."""
        path = os.path.join(self.root, directory)
        try:
            return {"restore_warm_s": read_checkpoint(path, ckpt)}
        finally:
            remove(path)  # keep the disk footprint at one checkpoint


# -- one round -------------------------------------------------------------------------------
def run_round(system: System, rnd: int, n_shards: int, shard_bytes: int) -> dict:
    """Mount, write one fresh checkpoint, wait until it is at the hub, verify it, unmount."""
    ckpt = Checkpoint.fresh(n_shards, shard_bytes, f"{system.name}-{rnd}")
    return {"system": system.name, "round": rnd, **write_round(system, ckpt, f"step-{rnd}")}


def write_round(system: System, ckpt: Checkpoint, directory: str, restore: bool = True) -> dict:
    """Mount, write ``ckpt`` into ``directory``, wait until it is at the hub, verify it, unmount;
    then (``restore``) time reading it back."""
    system.mount()
    try:
        os.mkdir(os.path.join(system.root, directory))
        os.sync()  # earlier rounds' dirty pages must not be flushed inside this one
        wan0 = system.wan_bytes_up()
        t0, stall = write_checkpoint(os.path.join(system.root, directory), ckpt)
        at_hub = system.at_hub(directory, ckpt, t0, stall)
        wan = system.wan_bytes_up()
    finally:
        extra = {**system.unmount(), **system.round_figures()}
    verified = system.verify(directory, ckpt)
    restored = system.restore(directory, ckpt, verified) if restore else {}
    return {**restored, "stall_s": stall, "at_hub_s": at_hub,
            "stall_mb_s": ckpt.shard_bytes / stall / MB,
            "wan_mb_up": None if wan0 is None or wan is None else (wan - wan0) / MB,
            "verified": verified, **extra}


# -- setup -----------------------------------------------------------------------------------
@contextlib.contextmanager
def servers(args: argparse.Namespace, work: str) -> Iterator[Env]:
    """Hub, two WAN links, spoke; stopped on every way out."""
    with contextlib.ExitStack() as stack:
        hub_proc, hub_url, hub_s3, token = start_hub(work, args.python)
        stack.callback(stop_process, hub_proc)
        hub = Hub(hub_url, token)
        stack.callback(hub.close)
        links = []
        for url in (hub_url, hub_s3):
            port = int(url.rsplit(":", 1)[1])
            proxy = WanProxy("127.0.0.1", port, delay_ms_up=args.rtt_ms / 2, delay_ms_down=args.rtt_ms / 2,
                             rate_mbit=args.rate_mbit).start()
            stack.callback(proxy.stop)
            links.append(proxy)
        from fabric.util.net import free_port

        # Two spokes in one static group: the one mounted, and its peer, which keeps the copies of
        # writes made with replicated durability (both reach the hub through the same WAN link).
        ports = [free_port(), free_port()]
        peers = ",".join(f"http://127.0.0.1:{p}" for p in ports)
        spoke = None
        seeds = os.path.join(work, "spoke-seeds") if args.spoke_seed_copies else None
        for name, port in zip(("spoke", "peer-spoke"), ports, strict=True):
            started = start_spoke(work, args.python, links[0].url_for(), token, name, port,
                                  ["--peers", peers, "--advertise", f"http://127.0.0.1:{port}",
                                   *(["--seed-copies", seeds] if seeds and name == "spoke" else [])])
            if started is None:
                raise SystemExit("this build's `fabric spoke` has no --s3-listen; bench_s3.start_spoke cannot start it")
            stack.callback(stop_process, started[0])
            spoke = spoke or started
        # A third spoke, in no group, that never sees a checkpoint before it restores it.
        cold = start_spoke(work, args.python, links[0].url_for(), token, "cold-spoke")
        stack.callback(stop_process, cold[0])
        yield Env(args.python, work, hub, hub_s3, spoke[1], cold[1], token, hub.s3_keys(), links[0], links[1], args.rate_mbit,
                  args.rclone_write_back, seeds)


def make_systems(env: Env, only: list[str] | None) -> list[System]:
    factories: dict[str, Callable[[], System]] = {
        "fabric-local": lambda: FabricMount(env, "local"),
        "fabric-writeback": lambda: FabricMount(env, "local", writeback=True),
        "fabric-writeback-replicated": lambda: FabricMount(env, "replicated", writeback=True),
        "fabric-writeback-tagged": lambda: FabricMount(env, "local", writeback=True, tagged=True),
        "fabric-local-whole": lambda: FabricMount(env, "local", stream=False),
        "fabric-replicated": lambda: FabricMount(env, "replicated"),
        "fabric-hub": lambda: FabricMount(env, "hub"),
        "rclone": lambda: RcloneMount(env),
        "s3fs": lambda: S3fsMount(env),
        "local-disk": lambda: LocalDisk(env),
    }
    return [factories[name]() for name in SYSTEMS if not only or name in only]


@contextlib.contextmanager
def unmounted_on_exit(systems: list[System]) -> Iterator[None]:
    """Whatever happens, leave no mount (and no rclone process) behind."""
    try:
        yield
    finally:
        for s in systems:
            if os.path.ismount(s.root) or getattr(s, "proc", None) is not None:
                s.unmount()


def dedup_rounds(env: Env, systems: list[System], args: argparse.Namespace) -> list[dict]:
    """Checkpoint N, then N+1 of a frozen-backbone step and of a full fine-tuning step, each
    written after N: what crosses the WAN and what the hub stores, against the bytes that changed."""
    out: list[dict] = []
    for system in systems:
        if system.name not in ("fabric-local", "rclone"):
            continue
        base = Checkpoint.fresh(args.shards, args.shard_mib * MiB, f"{system.name}-dedup")
        write_round(system, base, "dedup-n", restore=False)
        for case, changed in (("frozen backbone", args.changed_tensors), ("full fine-tune", TENSORS)):
            ckpt, diff = base.next_step(changed, f"{system.name}-{case}")
            stored = env.hub.stored_bytes()
            r = write_round(system, ckpt, "dedup-" + case.split()[0], restore=False)
            out.append({"system": system.name, "case": case, "changed_mb": diff / MB, "wan_mb_up": r["wan_mb_up"],
                        "stored_mb": (env.hub.stored_bytes() - stored) / MB, "stall_s": r["stall_s"], "at_hub_s": r["at_hub_s"]})
            print(f"dedup {system.name:12} {case:16} changed {diff / MB:7.1f} MB  sent {r['wan_mb_up']:7.1f} MB  "
                  f"stored {out[-1]['stored_mb']:7.1f} MB", file=sys.stderr, flush=True)
    return out


def measure(args: argparse.Namespace, work: str) -> tuple[list[dict], list[dict], dict[str, str]]:
    rounds: list[dict] = []
    with servers(args, work) as env:
        systems = make_systems(env, args.only)
        commands = {s.name: s.describe() for s in systems}
        with unmounted_on_exit(systems):
            for rnd in range(args.runs):
                k = rnd % len(systems)
                for s in systems[k:] + systems[:k]:
                    r = run_round(s, rnd, args.shards, args.shard_mib * MiB)
                    rounds.append(r)
                    at = "-" if r["at_hub_s"] is None else f"{r['at_hub_s']:.2f}"
                    print(f"round {rnd + 1} {s.name:12} stall {r['stall_s']:6.2f} s  at hub {at:>6} s  "
                          f"stall {r['stall_mb_s']:7.1f} MB/s  verified", file=sys.stderr, flush=True)
            dedup = dedup_rounds(env, systems, args) if args.changed_tensors else []
    return rounds, dedup, commands


# -- report ----------------------------------------------------------------------------------
ROWS = (("stall_s", "stall", "s"), ("at_hub_s", "at hub", "s"),
        ("tagged_s", "listed complete: its tag at the hub (fabric-writeback-tagged)", "s"), ("stall_mb_s", "stall throughput", "MB/s"),
        ("wan_mb_up", "sent over the WAN", "MB"),
        ("restore_warm_s", "restore: warm spoke (local-disk: from disk)", "s"),
        ("restore_warm_files_s", "restore: warm spoke, the mount reading its cache files", "s"),
        ("restore_cold_s", "restore: cold spoke (over the WAN)", "s"),
        ("restore_spoke_seeded_s", "restore: beside the spoke, `--passthrough` over the spoke's `--seed-copies` (with --spoke-seed-copies)", "s"),
        ("restore_seeded_s", "restore: the writer's machine, `--passthrough` over its `--seed-copies` (fabric-writeback)", "s"),
        ("restore_seeded_scrubbed_s", "restore: the same, the mount up until its scrub has checked the copies (fabric-writeback)", "s"),
        ("restore_seeded_trusted_s", "restore: the same, `--no-passthrough-check` (fabric-writeback)", "s"))
SEEDED_ROWS = ("restore_seeded_s", "restore_seeded_scrubbed_s", "restore_seeded_trusted_s")
#: The local disk's restore is the reference of every restore row.
LOCAL_REFERENCE = ({"restore_warm_files_s": "restore_warm_s", "restore_cold_s": "restore_warm_s", "restore_spoke_seeded_s": "restore_warm_s"}
                   | dict.fromkeys(SEEDED_ROWS, "restore_warm_s"))
#: The system a row's ratios are of (fabric-local where not named).
RATIO_OF = dict.fromkeys(SEEDED_ROWS, "fabric-writeback")


def summarize(rounds: list[dict]) -> dict:
    """Medians per system and row, and the round-by-round ratios of fabric-local to each peer."""
    out: dict = {"median": {}, "min": {}, "max": {}, "ratio": {}}
    for key, _, _ in ROWS:
        for s in SYSTEMS:
            xs = [r[key] for r in rounds if r["system"] == s and r.get(key) is not None]
            if xs:
                for stat, fn in (("median", median), ("min", min), ("max", max)):
                    out[stat].setdefault(key, {})[s] = fn(xs)
        for peer in ("rclone", "local-disk"):
            ratios = []
            for rnd in {r["round"] for r in rounds}:
                mine = [r.get(key) for r in rounds if r["round"] == rnd and r["system"] == RATIO_OF.get(key, "fabric-local")]
                theirs_key = LOCAL_REFERENCE.get(key, key) if peer == "local-disk" else key
                theirs = [r.get(theirs_key) for r in rounds if r["round"] == rnd and r["system"] == peer]
                if mine and theirs and mine[0] and theirs[0]:
                    ratios.append(mine[0] / theirs[0])
            if ratios:
                out["ratio"].setdefault(key, {})[peer] = median(ratios)
    return out


def render(report: dict) -> str:
    p, m, s = report["params"], report["machine"], report["summary"]
    lines = [
        (f"- machine: {m.get('host_cpus')} CPUs ({m.get('cpu', '?')}), {m.get('mem_gib', '?')} GiB RAM, "
        f"{m.get('platform')}, Python {m.get('python')}; {report['rclone_version']}; {report.get('s3fs_version', '-')}"),
        f"- fabric at {m.get('fabric_commit')}",
        f"- WAN: {p['rtt_ms']:g} ms RTT, {p['rate_mbit']:g} Mbit/s each way (WanProxy; one link spoke->hub REST, one rclone or s3fs->hub S3)",
        (f"- checkpoint: {p['shards']} x {p['shard_mib']} MiB fresh random bytes, one thread per shard, "
        f"{WRITE_SIZE // MiB} MiB writes, fsync, close; then .metadata.tmp written, fsynced, renamed to .metadata"),
        (f"- {p['runs']} round(s), systems' order rotating; medians (min..max); ratios = fabric-local's figure / the other's, "
        "median of the per-round ratios"),
        ("- at hub: fabric-local = spoke `writeback_pending` reached 0; fabric-hub = the stall; "
        "rclone and s3fs = every file answers HEAD with its size on the hub's S3 port (no WAN), .metadata.tmp gone"),
        "- every round committed at the hub and each file read back and compared by sha256 (local-disk: read back from the directory): all matched",
        ("- restore: every shard read back, one thread each, sha256 checked, after dropping the page cache: local-disk from its disk; "
         "fabric-local through a read-only `fabric mount SPOKE repo@COMMIT` of the spoke that wrote it (warm), the same with "
         "`--spoke-cache` (the mount reads the spoke's cache files, as a mount beside its spoke may), and of a third spoke "
         "in no group that never saw it (cold: every chunk over the same WAN link); fabric-writeback (which runs with "
         "`--seed-copies DIR`) through a `--passthrough` mount of the commit with `--cache-dir DIR` right after "
         "mounting (each seed counts as checked when the writer's mount summed it, within a day; an older one is read "
         "whole at its first open), then once the mount's scrub has checked any it had to (before the page cache is dropped), and with "
         "`--no-passthrough-check` (copies trusted at rest); each restore row's ratio to local-disk is against local-disk's "
         "read from its disk, and is fabric-writeback's in the last three rows"),
        f"- command: `{report['command']}`",
        "",
        "| row | unit | " + " | ".join(SYSTEMS) + " | fabric-local / rclone | fabric-local / local-disk |",
        "|---|---|" + "---:|" * (len(SYSTEMS) + 2),
    ]
    for key, label, unit in ROWS:
        cells = []
        for sys_name in SYSTEMS:
            med = s["median"].get(key, {}).get(sys_name)
            if med is None:
                cells.append("-")
            elif unit == "s":
                cells.append(f"{med:.2f} ({s['min'][key][sys_name]:.2f}..{s['max'][key][sys_name]:.2f})")
            else:
                cells.append(f"{med:,.1f}")
        ratios = [s["ratio"].get(key, {}).get(peer) for peer in ("rclone", "local-disk")]
        cells += ["-" if x is None else f"{x:.2f}" for x in ratios]
        lines.append(f"| {label} | {unit} | " + " | ".join(cells) + " |")
    umount = {sys_name: median([r["umount_s"] for r in report["rounds"] if r["system"] == sys_name and "umount_s" in r])
              for sys_name in ("fabric-local", "fabric-hub", "rclone") if any(r["system"] == sys_name for r in report["rounds"])}
    if umount:
        lines += ["", "Unmount after the checkpoint reached the hub (median s): "
                  + ", ".join(f"{k} {v:.2f}" for k, v in umount.items()) + "."]
    if report["dedup"]:
        lines += ["", (f"Checkpoint N+1 written after N (one round each; each shard is {TENSORS} equal tensors, a frozen-backbone step "
                       f"changes the last {p['changed_tensors']} of them, full fine-tuning all):"), "",
                  "| system | step N+1 | changed MB | sent over the WAN MB | sent / changed | stored at the hub MB | stall s |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for d in report["dedup"]:
            ratio = d["wan_mb_up"] / d["changed_mb"] if d["wan_mb_up"] is not None and d["changed_mb"] else None
            lines.append(f"| {d['system']} | {d['case']} | {d['changed_mb']:,.1f} | {d['wan_mb_up']:,.1f} | "
                         f"{'-' if ratio is None else f'{ratio:.2f}'} | {d['stored_mb']:,.1f} | {d['stall_s']:.2f} |")
    return "\n".join(lines) + "\n"


# -- main ------------------------------------------------------------------------------------
def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=None, help="files per checkpoint, one writer thread each (default 4)")
    ap.add_argument("--shard-mib", type=int, default=None, help="MiB per shard (default 64)")
    ap.add_argument("--runs", type=int, default=None, help="rounds (default 3)")
    ap.add_argument("--quick", action="store_true", help="smoke test: 2 x 16 MiB, 1 round (unless given)")
    ap.add_argument("--rtt-ms", type=float, default=50.0, help="WAN round-trip time (default 50)")
    ap.add_argument("--rate-mbit", type=float, default=200.0, help="WAN rate each way (default 200)")
    ap.add_argument("--rclone-write-back", default="1s",
                    help="rclone's --vfs-write-back: how long it holds a closed file before uploading (default 1s; "
                    "rclone's own default is 5s; 0s loses a file renamed during its upload, see the module doc)")
    ap.add_argument("--changed-tensors", type=int, default=2,
                    help=f"dedup rounds: tensors of each shard's {TENSORS} that a frozen-backbone step changes (default 2; 0 skips the dedup rounds)")
    ap.add_argument("--only", choices=SYSTEMS, action="append", help="measure only these systems (repeatable)")
    ap.add_argument("--spoke-seed-copies", action="store_true",
                    help="the spoke keeps plain copies of the files written through it (`--seed-copies`); fabric-local's restore "
                         "adds a `--passthrough` mount beside it over them (its background copies cost the spoke CPU and disk)")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--work", default=os.path.join(HERE, "work", "stores"))
    ap.add_argument("--keep-work", action="store_true", help="keep the work directory (stores, logs) after a good run")
    ap.add_argument("--json-out")
    ap.add_argument("--md-out")
    args = ap.parse_args()
    args.shards = args.shards or (2 if args.quick else 4)
    args.shard_mib = args.shard_mib or (16 if args.quick else 64)
    args.runs = args.runs or (1 if args.quick else 3)
    return args


def main() -> None:
    args = parse_args()
    for tool in ("rclone", "fusermount3", *(["s3fs"] if not args.only or "s3fs" in args.only else [])):
        if not shutil.which(tool):
            raise SystemExit(f"bench_checkpoint.py: {tool} is not on PATH")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that every finally below runs
    work = os.path.join(args.work, "checkpoint")
    remove(work)
    os.makedirs(work)
    rounds, dedup, commands = measure(args, work)
    if not args.keep_work:
        remove(work)  # kept, with every log, when the run fails
    report = {
        "machine": machine(),
        "rclone_version": subprocess.run(["rclone", "version"], capture_output=True, text=True, check=False).stdout.splitlines()[0],
        "s3fs_version": (subprocess.run(["s3fs", "--version"], capture_output=True, text=True, check=False).stdout.splitlines() or ["-"])[0]
        if shutil.which("s3fs") else "-",
        "params": {"shards": args.shards, "shard_mib": args.shard_mib, "write_size": WRITE_SIZE, "runs": args.runs,
                   "rtt_ms": args.rtt_ms, "rate_mbit": args.rate_mbit, "changed_tensors": args.changed_tensors},
        "command": " ".join(["python", os.path.relpath(sys.argv[0], os.path.dirname(HERE)), *sys.argv[1:]]),
        "commands": commands,
        "rounds": rounds,
        "dedup": dedup,
        "summary": summarize(rounds),
    }
    text = render(report)
    print(text)
    save_report(text, report, args.json_out, args.md_out)


if __name__ == "__main__":
    main()
