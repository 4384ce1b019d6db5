#!/usr/bin/env python3
"""Accelerator utilisation of GPU data loaders across a WAN (issue 14), MLPerf Storage style.

What: how busy emulated accelerators stay when a PyTorch ``DataLoader`` feeds
them from a dataset held at a hub across a WAN, read through a spoke (with and
without loader hints) or straight from the hub's S3 API by the usual peers.

Method (MLPerf Storage / DLIO): an emulated accelerator "computes" by sleeping
a fixed time per batch. Accelerator utilisation AU = compute time / wall time
of the epoch. N accelerators that each take ``compute_s`` per batch need
N / compute_s batches per second from the loader. They are modelled as one
DataLoader and one consumer that sleeps ``compute_s / N`` after each batch:
the demand on the loader is the same, and so is AU (each of N accelerators
would compute ``batches / N`` batches of ``compute_s`` within the same wall
time), because the loader, not the consumer, is what the benchmark measures.
DataLoader: ``--workers`` worker processes (default 2), ``prefetch_factor`` 2,
persistent workers, samples in a random order drawn per epoch from a seed (the
same order for every reader in a round), a batch handed to the training loop as
one tensor (:func:`collate`).

Figures per reader and epoch:

- at the load point (``--load``: the data rate the accelerators ask for, as a
  fraction of the link's rate; 0.8 by default, 2.0 for the 1.5x-cache
  workload): AU and the bytes that crossed the WAN (both directions, counted by
  the in-process :class:`testbed.wanproxy.WanProxy` the reader's traffic goes
  through);
- capacity: one epoch without compute gives the loader's rate R (batches/s);
  the MLPerf figure, the largest number of accelerators at which AU stays
  >= 90%, is then ``N90 = floor(R * compute_s / 0.9)`` (at N accelerators
  AU = min(1, R * compute_s / N)). It is computed, then verified: one more
  epoch runs at N90 and its AU is reported next to it (not with
  ``--no-verify``, the default of ``--quick``). Cold: a capacity epoch
  and a verify epoch, each from a fresh cache; warm: both after the load-point
  epochs, caches kept. Every session starts with the kernel's page cache written
  back and dropped (as root), so cold epochs read the hub's disk.

Every sample's sha256 is computed in the worker that read it and checked
against the dataset's, and every epoch must read each file exactly once: a
reader that returns wrong or missing data stops the run.

Workloads, scaled to a 2-core machine and a 1 Gbit/s link (MLPerf's unet3d
reads ~140 MiB files, one sample per file, and resnet50 ~110 KiB JPEGs):

- ``large`` (unet3d-like): ``--large-files`` x ``--large-mib`` MiB (24 x 32 MiB;
  files 1/4 of unet3d's), batch of 1 file, ``--compute-large`` s per batch;
- ``small`` (resnet50-like): ``--small-files`` x 110 KiB (3,000; same size as
  resnet50's), batch of 64, ``--compute-small`` s per batch;
- ``large-1.5x``: the large dataset through a spoke whose ``--cache-size`` is
  the dataset / 1.5 (rclone's ``--vfs-cache-max-size`` the same), at a load of
  ``--thrash-load`` x the link, 2 epochs; only the readers that cache.

All files are incompressible random bytes (deterministic from ``--seed``).

Setup: ``fabric hub --s3-listen`` on loopback holds the datasets (imported
once). Two WanProxy links per rate (``--rates``, Mbit/s each way, 50 ms RTT by
``--rtt-ms``): one in front of the hub's REST port (the spoke's), one in front
of its S3 port (rclone's, s3fs's, s3torchconnector's). Readers, side by side,
their order rotating round by round:

- ``fabric-hints``: ``fabric.torch.FabricFileDataset`` read from a spoke with a
  ``HintingSampler`` (each epoch's order sent as a hint), job id set;
- ``fabric-mount``: a folder dataset (``open()``/``read()`` per file) on
  ``fabric mount SPOKE repo@COMMIT``, the mount run with ``FABRIC_JOB``;
- ``fabric-learned``: the same, on a spoke that has seen an earlier job read the
  data set (8 threads through its REST API, in another random order, as job
  ``JOB-teacher``) and was then restarted with its chunk cache emptied (what it
  learnt is kept in its cache directory): the learned working set is all the
  mount's first epoch gets ahead of time. Only the load-point epochs; its job
  stats give the learned prefetch's coverage, accuracy and waste;
- ``rclone``: the same folder dataset on ``rclone mount`` of the hub's S3 API
  (see RCLONE_FLAGS for the flags and why);
- ``s3fs``: fsspec's ``s3fs`` ``cat_file`` per sample against the hub's S3 API
  (run with the S3 tools venv ``make test`` builds, ``--s3tools``, with this
  venv's torch appended to its path: s3fs pins a botocore older than fabric's);
- ``s3torchconnector``: its ``S3MapDataset.from_objects`` against the hub's S3
  API (custom endpoint, path-style addressing);
- ``local-disk``: the folder dataset on the local directory the hub imported, no
  WAN: what the same DataLoader, sampler and consumer get with the data already
  next to them (load-point epochs only). An epoch's first batch here is the
  loader's own start-up cost.

A spoke (with a fresh cache) and the mounts are started for each reader's
session and stopped after it; for fabric-hints the spoke's per-job stats
(``GET /api/v1/stats`` -> ``jobs``) give the prefetch accuracy and waste.

    python bench/bench_loader.py --quick                      # smoke test: 5-10 min on 2 busy CPUs
    python bench/bench_loader.py --rates 1000 --runs 1        # one link
    python bench/bench_loader.py --json-out r.json --md-out r.md

Needs root or user FUSE, ``rclone`` on PATH, the ``torch`` extra, and for
``s3fs`` the S3 tools venv (``make test`` builds ``.venv-s3tools``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _common import (
    FABRIC_SRC,
    MB,
    REPO_ROOT,
    drop_page_cache,
    fabric_cmd,
    fabric_env,
    loadavg,
    machine,
    median,
    remove,
    save_report,
    stop_process,
    unmount,
)

MiB = 1024 * 1024
KiB = 1024
SMALL_SIZE = 110 * KiB
AU_TARGET = 0.9
#: The trainer's exit status when a reader returned bytes that are not the dataset's.
WRONG_DATA_EXIT = 3
READERS = ("fabric-hints", "fabric-mount", "fabric-learned", "rclone", "s3fs", "s3torchconnector", "local-disk")
PEERS = ("rclone", "s3fs", "s3torchconnector")
CACHING = ("fabric-hints", "fabric-mount", "rclone")
#: rclone mount as a user would set it up to train from S3: a full VFS cache (files kept on
#: local disk, so a second epoch is local), bounded like the spoke's cache; 64 MiB read-ahead
#: and a 32 MiB buffer per open file so large files stream; read-only; listings cached for
#: the job; the cache's size checked every second (rclone evicts only when it checks: with the
#: default minute it would overshoot its bound for whole epochs here, which are shorter than
#: a real job's).
RCLONE_FLAGS = ["--vfs-cache-mode", "full", "--vfs-read-ahead", "64M", "--buffer-size", "32M", "--read-only",
                "--dir-cache-time", "1h", "--vfs-cache-poll-interval", "1s"]


# == the trainer: runs in its own process, one per reader session ============================
def sample(data: bytes, path: str) -> tuple:
    """What a worker hands the training loop: the path, the bytes as a uint8 tensor, their sha256."""
    import torch

    return path, torch.frombuffer(bytearray(data), dtype=torch.uint8), hashlib.sha256(data).hexdigest()


def collate(items: list) -> tuple:
    """A batch as a training loader hands it over: its samples' bytes in one tensor (as
    ``default_collate`` stacks equal-sized samples; here concatenated, sizes may differ), with
    the paths and sha256s beside it. One tensor is one shared-memory segment to pass from a
    worker to the training loop; 64 tensors were 64, and the loop spent about 14 ms per batch
    outside its sleep on them (inferred from a warm epoch's AU, 84% at a 72 ms sleep per
    batch: time an accelerator would have waited)."""
    import torch

    return [p for p, _, _ in items], torch.cat([t for _, t, _ in items]), [d for _, _, d in items]


class FolderDataset:
    """A folder of files, one sample per file read with open()/read() (on a mount)."""

    def __init__(self, root: str, paths: list[str]) -> None:
        self.root, self.paths = root, paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple:
        with open(os.path.join(self.root, self.paths[i]), "rb") as f:
            return sample(f.read(), self.paths[i])


class S3fsDataset:
    """One object per sample, read whole with s3fs's ``cat_file``; a file system per process."""

    def __init__(self, s3: dict, paths: list[str]) -> None:
        self.s3, self.paths = s3, paths
        self._fs, self._pid = None, 0

    def __len__(self) -> int:
        return len(self.paths)

    def fs(self):
        if self._fs is None or self._pid != os.getpid():
            import s3fs

            self._fs = s3fs.S3FileSystem(key=self.s3["key"], secret=self.s3["secret"], skip_instance_cache=True,
                                         client_kwargs={"endpoint_url": self.s3["endpoint"], "region_name": "us-east-1"})
            self._pid = os.getpid()
        return self._fs

    def __getitem__(self, i: int) -> tuple:
        p = self.paths[i]
        return sample(self.fs().cat_file(f"{self.s3['bucket']}/{self.s3['prefix']}{p}"), p)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fs": None, "_pid": 0}


class S3TorchSample:
    """s3torchconnector's transform: an S3Reader to a sample."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def __call__(self, reader) -> tuple:
        return sample(reader.read(), reader.key[len(self.prefix):])


def make_dataset(cfg: dict):
    paths = cfg["paths"]
    kind = cfg["reader"]
    if kind == "folder":
        return FolderDataset(cfg["root"], paths)
    if kind == "s3fs":
        return S3fsDataset(cfg["s3"], paths)
    if kind == "s3torchconnector":
        from s3torchconnector import S3ClientConfig, S3MapDataset

        s3 = cfg["s3"]
        os.environ.update({"AWS_ACCESS_KEY_ID": s3["key"], "AWS_SECRET_ACCESS_KEY": s3["secret"]})
        return S3MapDataset.from_objects([f"s3://{s3['bucket']}/{s3['prefix']}{p}" for p in paths], region="us-east-1",
                                         endpoint=s3["endpoint"], transform=S3TorchSample(s3["prefix"]),
                                         s3client_config=S3ClientConfig(force_path_style=True))
    if kind == "fabric-hints":
        from fabric.torch import FabricFileDataset

        ds = FabricFileDataset(cfg["url"], decode=sample, server=cfg["server"], token=cfg["token"], job=cfg["job"])
        if ds.paths != paths:
            raise SystemExit(f"FabricFileDataset lists {len(ds.paths)} files, not the {len(paths)} imported")
        return ds
    raise SystemExit(f"unknown reader kind {kind!r}")


class EpochOrder:
    """A random permutation of the samples per epoch, from ``seed`` and the epoch number."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        order = list(range(self.n))
        random.Random(self.seed * 1000 + self.epoch).shuffle(order)
        return iter(order)


def wrong(message: str) -> None:
    """End the trainer for data that is not the dataset's: the run stops (a failure to read only skips the reader)."""
    print(message, file=sys.stderr, flush=True)
    sys.exit(WRONG_DATA_EXIT)


def emit(event: dict) -> None:
    print(json.dumps(event), flush=True)


def trainer(cfg_path: str) -> None:
    """Run the session's steps (epochs) and print one JSON event per epoch start and end."""
    with open(cfg_path) as f:
        cfg = json.load(f)
    extra = os.environ.get("BENCH_LOADER_EXTRA_PATH")
    if extra:
        sys.path.append(extra)  # after this interpreter's own packages (s3fs's botocore wins)
    import torch.utils.data

    if cfg.get("spoke_cache"):
        os.environ["FABRIC_SPOKE_CACHE"] = cfg["spoke_cache"]  # for fabric:// in this process and its workers
    ds = make_dataset(cfg)
    order = EpochOrder(len(cfg["paths"]), cfg["seed"])
    sampler = order
    if cfg["reader"] == "fabric-hints":
        from fabric.torch import HintingSampler

        sampler = HintingSampler(order, ds)
    loader = torch.utils.data.DataLoader(ds, batch_size=cfg["batch"], sampler=sampler, num_workers=cfg["workers"],
                                         collate_fn=collate, persistent_workers=cfg["workers"] > 0,
                                         prefetch_factor=2 if cfg["workers"] else None)
    want = dict(zip(cfg["paths"], cfg["digests"]))
    rate = None  # batches/s of the last capacity epoch
    for step in cfg["steps"]:
        n = step.get("n")
        if step.get("verify"):
            n = max(1, math.floor(rate * cfg["compute_s"] / AU_TARGET))
        pause = step["pause_s"] if "pause_s" in step else (cfg["compute_s"] / n if n else 0.0)
        sampler.set_epoch(step["order"])
        emit({"event": "start", "label": step["label"]})
        seen: dict[str, int] = {}
        nbytes = batches = 0
        first_s = None  # seconds until the first batch reached the loop (the epoch's start-up)
        t0 = time.perf_counter()
        for paths, tensor, digests in loader:
            if first_s is None:
                first_s = time.perf_counter() - t0
            for path, digest in zip(paths, digests):
                if digest != want.get(path):
                    wrong(f"DATA MISMATCH: {cfg['reader']} read {path} with sha256 {digest}, want {want.get(path)}")
                seen[path] = seen.get(path, 0) + 1
            nbytes += tensor.numel()
            batches += 1
            if pause:
                time.sleep(pause)
        wall = time.perf_counter() - t0
        if len(seen) != len(want) or any(v != 1 for v in seen.values()):
            wrong(f"{cfg['reader']}: epoch {step['label']} read {len(seen)} distinct of {len(want)} files, some more than once")
        if not pause:
            rate = batches / wall
        event = {"event": "end", "label": step["label"], "wall_s": wall, "bytes": nbytes, "batches": batches,
                 "mb_s": nbytes / wall / MB, "pause_s": pause, "n": n, "verified": True,
                 "au": batches * pause / wall if pause else None, "first_s": first_s}
        if not pause:
            event["n90"] = math.floor(rate * cfg["compute_s"] / AU_TARGET)
        if sampler is not order:
            event["hint"] = sampler.last_hint  # the spoke's answer to this epoch's hint; None: not taken
        emit(event)


# == the orchestrator ==========================================================================
@dataclass
class Workload:
    name: str
    repo: str
    paths: list[str]
    digests: list[str]
    size: int  # bytes in all
    batch: int
    compute_s: float  # one accelerator's compute time per batch
    load: float  # demanded data rate / link rate at the load point
    cache_bytes: int | None = None  # the spoke's and rclone's cache bound (None: the default, 4 GiB)
    readers: tuple[str, ...] = READERS
    capacity: bool = True
    tree: str = ""  # the local directory imported
    commit: str = ""

    @property
    def batch_bytes(self) -> float:
        return self.size / math.ceil(len(self.paths) / self.batch)


def generate(root: str, name: str, count: int, size: int, seed: int) -> tuple[str, list[str], list[str]]:
    """``count`` files of ``size`` random bytes under ``root/name/tree`` (kept between runs); paths, sha256s."""
    base = os.path.join(root, name)
    manifest = os.path.join(base, "manifest.json")
    params = {"count": count, "size": size, "seed": seed}
    if os.path.exists(manifest):
        with open(manifest) as f:
            m = json.load(f)
        if m["params"] == params:
            return os.path.join(base, "tree"), m["paths"], m["digests"]
    remove(base)
    rnd = random.Random(f"{name}-{seed}")
    paths, digests = [], []
    for i in range(count):
        path = f"train/{i // 1000:03d}/{name}-{i:05d}.bin"
        data = rnd.randbytes(size)
        full = os.path.join(base, "tree", path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(data)
        paths.append(path)
        digests.append(hashlib.sha256(data).hexdigest())
    with open(manifest, "w") as f:
        json.dump({"params": params, "paths": paths, "digests": digests}, f)
    return os.path.join(base, "tree"), paths, digests


def tail(path: str, n: int = 3000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return "(no log)"


@dataclass
class Env:
    """The servers and links of one rate."""

    args: argparse.Namespace
    work: str
    hub_url: str
    token: str
    s3_keys: tuple[str, str]
    rate_mbit: float
    wan_rest: object  # WanProxy in front of the hub's REST port (the spoke's link)
    wan_s3: object  # WanProxy in front of the hub's S3 port (the S3 readers' link)
    cli: list[str] = field(default_factory=list)


class Reader:
    """One way of reading a workload; ``start`` makes a cold session, ``stop`` ends it."""

    name = ""
    link = "s3"
    python: str = sys.executable
    #: Whether the reader keeps what it read: without a cache every epoch is a cold one.
    caches = True
    #: Whether capacity and N90 epochs are run for it (else only the load-point epochs).
    capacity = True
    #: The most load-point epochs run for it (None: ``--epochs``).
    max_epochs: int | None = None

    def __init__(self, env: Env, wl: Workload, job: str) -> None:
        self.env, self.wl, self.job = env, wl, job
        self.dir = os.path.join(env.work, f"{self.name}-{wl.name}")

    def start(self) -> dict:
        """Bring up what the reader needs (cold) and return its trainer config."""
        raise NotImplementedError

    def stop(self) -> None: ...

    def wan(self):
        return self.env.wan_rest if self.link == "rest" else self.env.wan_s3

    def job_stats(self) -> dict | None:
        return None

    def trainer_env(self) -> dict[str, str]:
        return fabric_env()

    def s3(self) -> dict:
        ak, sk = self.env.s3_keys
        return {"endpoint": self.env.wan_s3.url_for(), "key": ak, "secret": sk, "bucket": self.wl.repo, "prefix": "main/"}

    def describe(self) -> str:
        raise NotImplementedError


class SpokeReader(Reader):
    """A reader through a spoke that starts with an empty cache."""

    link = "rest"
    spoke: subprocess.Popen | None = None

    def start_spoke(self, keep_cache: bool = False) -> str:
        from bench_s3 import _wait

        from fabric.util.net import free_port

        cache = os.path.join(self.dir, "spoke-cache")
        if not keep_cache:
            remove(cache)
        os.makedirs(self.dir, exist_ok=True)
        port = free_port()
        self.spoke_log = os.path.join(self.dir, "spoke.log")
        log = open(self.spoke_log, "ab")  # noqa: SIM115 - the spoke writes it until stopped
        size = str(self.wl.cache_bytes) if self.wl.cache_bytes else "4GiB"
        self.spoke = subprocess.Popen([*self.env.cli, "spoke", "--hub", self.env.wan_rest.url_for(), "--cache", cache,
                                       "--cache-size", size, "--listen", f"127.0.0.1:{port}", "--token", self.env.token,
                                       "--log-level", "warning", *self.env.args.spoke_arg],
                                      stdout=log, stderr=subprocess.STDOUT, env=fabric_env(), cwd=FABRIC_SRC)
        log.close()
        self.spoke_url = f"http://127.0.0.1:{port}"
        _wait(self.spoke_url + "/healthz", proc=self.spoke, log=self.spoke_log)
        return self.spoke_url

    def stop_spoke(self) -> None:
        stop_process(self.spoke)
        self.spoke = None
        remove(os.path.join(self.dir, "spoke-cache"))

    def spoke_stats(self) -> dict:
        import httpx

        r = httpx.get(self.spoke_url + "/api/v1/stats", headers={"Authorization": f"Bearer {self.env.token}"}, timeout=30)
        r.raise_for_status()
        return r.json()

    def job_stats(self) -> dict | None:
        return self.spoke_stats().get("jobs", {}).get(self.job)


class FabricHints(SpokeReader):
    name = "fabric-hints"

    def start(self) -> dict:
        url = self.start_spoke()
        return {"reader": "fabric-hints", "server": url, "token": self.env.token, "job": self.job,
                "url": f"fabric://{self.wl.repo}@{self.wl.commit}/",
                "spoke_cache": os.path.join(self.dir, "spoke-cache") if self.env.args.beside else None}

    def stop(self) -> None:
        self.stop_spoke()

    def describe(self) -> str:
        beside = " with FABRIC_SPOKE_CACHE=the spoke's --cache (it reads the chunks the spoke's files hold)" if self.env.args.beside else ""
        return ("FabricFileDataset('fabric://REPO@COMMIT/', server=SPOKE, job=JOB) + "
                f"HintingSampler(RandomOrder, dataset); fabric spoke --hub WAN --cache-size SIZE{beside}")


class FabricMount(SpokeReader):
    name = "fabric-mount"

    def mount_cmd(self, url: str) -> list[str]:
        return [*self.env.cli, "mount", url, f"{self.wl.repo}@{self.wl.commit}", self.root, "--token", self.env.token,
                "--log-file", os.path.join(self.dir, "mount.log")]

    def start(self) -> dict:
        return self.mount(self.start_spoke())

    def mount(self, url: str) -> dict:
        self.root = os.path.join(self.dir, "mnt")
        os.makedirs(self.root, exist_ok=True)
        p = subprocess.run(self.mount_cmd(url), env={**fabric_env(), "FABRIC_JOB": self.job}, cwd=FABRIC_SRC,
                           capture_output=True, text=True, check=False)
        if p.returncode != 0 or not os.path.ismount(self.root):
            unmount(self.root)
            raise SystemExit(f"fabric mount failed (exit {p.returncode}): {p.stderr[-2000:]}")
        return {"reader": "folder", "root": self.root}

    def stop(self) -> None:
        subprocess.run([*self.env.cli, "umount", self.root], env=fabric_env(), cwd=FABRIC_SRC, capture_output=True, check=False)
        unmount(self.root)
        self.stop_spoke()

    def describe(self) -> str:
        return "open()/read() per file on: FABRIC_JOB=JOB fabric mount SPOKE REPO@COMMIT MNT (defaults)"


class FabricLearned(FabricMount):
    name = "fabric-learned"
    capacity = False
    max_epochs = 1  # later epochs read what the first left in the cache, as fabric-mount's do

    def start(self) -> dict:
        self.start_spoke()
        self.teach()
        stop_process(self.spoke)
        remove(os.path.join(self.dir, "spoke-cache", "chunks"))  # what it learnt stays: workload.db
        return self.mount(self.start_spoke(keep_cache=True))

    def teach(self) -> None:
        """An earlier job reads every file once through the spoke, until the spoke has learnt them all."""
        from concurrent.futures import ThreadPoolExecutor

        from fabric.client.http import HttpPlane

        paths = list(self.wl.paths)
        random.Random(f"teacher-{self.job}").shuffle(paths)
        plane = HttpPlane(self.spoke_url, self.env.token, job=f"{self.job}-teacher")
        try:
            with ThreadPoolExecutor(8) as pool:
                for data in pool.map(lambda p: plane.read(self.wl.repo, self.wl.commit, p), paths):
                    assert data
        finally:
            plane.close()
        deadline = time.monotonic() + 60
        while (learned := self.spoke_stats()["learned_prefetch"])["files"] < len(paths):
            if time.monotonic() > deadline:
                raise SystemExit(f"the spoke learnt {learned} of the teacher's {len(paths)} files")
            time.sleep(0.5)

    def describe(self) -> str:
        return ("open()/read() per file on FABRIC_JOB=JOB fabric mount SPOKE REPO@COMMIT MNT (defaults), the spoke "
                "restarted with no chunks cached after job JOB-teacher read every file through it")


class Rclone(Reader):
    name = "rclone"

    def cmd(self) -> list[str]:
        size = f"{self.wl.cache_bytes}B" if self.wl.cache_bytes else "4G"  # a bare number would be KiB to rclone
        return ["rclone", "mount", f"wan:{self.wl.repo}/main", self.root, "--cache-dir", self.cache,
                "--vfs-cache-max-size", size, *RCLONE_FLAGS]

    def start(self) -> dict:
        self.root, self.cache = os.path.join(self.dir, "mnt"), os.path.join(self.dir, "cache")
        remove(self.cache)
        os.makedirs(self.root, exist_ok=True)
        ak, sk = self.env.s3_keys
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RCLONE_"))}
        p = "RCLONE_CONFIG_WAN_"
        env.update({"RCLONE_CONFIG": os.devnull, p + "TYPE": "s3", p + "PROVIDER": "Other", p + "ENV_AUTH": "false",
                    p + "ACCESS_KEY_ID": ak, p + "SECRET_ACCESS_KEY": sk, p + "REGION": "us-east-1",
                    p + "ENDPOINT": self.env.wan_s3.url_for(), p + "FORCE_PATH_STYLE": "true"})
        self.log = os.path.join(self.dir, "rclone.log")
        self.proc = subprocess.Popen([*self.cmd(), "--log-file", self.log], env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not os.path.ismount(self.root):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"rclone mount did not come up:\n{tail(self.log)}")
            time.sleep(0.1)
        return {"reader": "folder", "root": self.root}

    def stop(self) -> None:
        unmount(self.root)
        stop_process(self.proc)
        remove(self.cache)

    def describe(self) -> str:
        return " ".join(self.cmd()).replace(self.root, "MNT").replace(self.cache, "CACHE") if hasattr(self, "root") else \
            "rclone mount wan:REPO/main MNT --cache-dir CACHE --vfs-cache-max-size SIZE " + " ".join(RCLONE_FLAGS)


class S3fs(Reader):
    name = "s3fs"
    caches = False

    def __init__(self, env: Env, wl: Workload, job: str) -> None:
        super().__init__(env, wl, job)
        self.python = os.path.join(env.args.s3tools, "bin", "python")

    def start(self) -> dict:
        return {"reader": "s3fs", "s3": self.s3()}

    def trainer_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
        env["BENCH_LOADER_EXTRA_PATH"] = sysconfig.get_paths()["purelib"]  # torch and numpy from this venv
        return env

    def describe(self) -> str:
        return "s3fs.S3FileSystem(endpoint_url=WAN).cat_file('REPO/main/PATH') per sample (defaults)"


class S3Torch(Reader):
    name = "s3torchconnector"
    caches = False

    def start(self) -> dict:
        return {"reader": "s3torchconnector", "s3": self.s3()}

    def describe(self) -> str:
        return ("S3MapDataset.from_objects(['s3://REPO/main/PATH', ...], region='us-east-1', endpoint=WAN, "
                "s3client_config=S3ClientConfig(force_path_style=True))")


class LocalDisk(Reader):
    """The bound: the same DataLoader over the local directory the hub imported, no WAN, the
    page cache as it is (not dropped)."""

    name = "local-disk"
    capacity = False

    def start(self) -> dict:
        return {"reader": "folder", "root": self.wl.tree}

    def describe(self) -> str:
        return "open()/read() per file on the local directory the hub imported (no WAN; the page cache as it is)"


READER_CLASSES = {"fabric-hints": FabricHints, "fabric-mount": FabricMount, "fabric-learned": FabricLearned,
                  "rclone": Rclone, "s3fs": S3fs, "s3torchconnector": S3Torch, "local-disk": LocalDisk}


def link_bytes(wan) -> int:
    return wan.bytes_up + wan.bytes_down


def run_session(reader: Reader, steps: list[dict], tag: str) -> list[dict]:
    """Start the reader cold, run the trainer through ``steps``; one result per step."""
    wl, env = reader.wl, reader.env
    drop_page_cache()  # cold: nothing cached, the kernel's pages included; and no cost of the caches removed before
    cfg = {**reader.start(), "paths": wl.paths, "digests": wl.digests, "batch": wl.batch, "workers": env.args.workers,
           "compute_s": wl.compute_s, "seed": env.args.seed, "steps": steps}
    results: list[dict] = []
    try:
        cfg_path = os.path.join(env.work, f"trainer-{reader.name}-{wl.name}.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        log_path = os.path.join(env.work, f"trainer-{reader.name}-{wl.name}.log")
        with open(log_path, "ab") as log:
            proc = subprocess.Popen([reader.python, os.path.abspath(__file__), "--trainer", cfg_path],
                                    stdout=subprocess.PIPE, stderr=log, env=reader.trainer_env(), cwd=FABRIC_SRC, text=True)
            wan = reader.wan()
            mark = link_bytes(wan)
            for line in proc.stdout:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if ev.get("event") == "start":
                    mark = link_bytes(wan)
                elif ev.get("event") == "end":
                    ev.update({"wan_bytes": link_bytes(wan) - mark, "reader": reader.name, "workload": wl.name,
                               "rate_mbit": env.rate_mbit, "session": tag})
                    ev.pop("event")
                    results.append(ev)
                    print(f"  {env.rate_mbit:g} Mbit/s {wl.name:10} {reader.name:16} {ev['label']:10} "
                          f"{ev['mb_s']:7.1f} MB/s  AU {'-' if ev['au'] is None else format(ev['au'], '.3f'):>5}  "
                          f"N {ev['n'] or '-'}  WAN {ev['wan_bytes'] / MB:7.1f} MB  first batch {ev['first_s'] or 0:.2f} s  "
                          f"waited {ev['wall_s'] - ev['batches'] * ev['pause_s']:.2f} s", file=sys.stderr, flush=True)
            rc = proc.wait()
        if rc == WRONG_DATA_EXIT:
            raise SystemExit(f"{reader.name} read wrong data; the end of {log_path}:\n{tail(log_path)}")
        if rc != 0:
            # A reader that breaks down is a result too: recorded, and the run goes on.
            error = tail(log_path, 20000).strip().splitlines()[-1] if os.path.exists(log_path) else f"exit {rc}"
            print(f"  {reader.name} {wl.name} {tag}: FAILED (exit {rc}): {error}", file=sys.stderr, flush=True)
            done = {r["label"] for r in results}
            failed = next((st["label"] for st in steps if st["label"] not in done), tag)
            return results + [{"reader": reader.name, "workload": wl.name, "rate_mbit": env.rate_mbit, "session": tag,
                               "label": failed, "failed": error}]
        stats = reader.job_stats()
        if stats is not None and results:
            results[-1]["job_stats"] = stats
    finally:
        reader.stop()
    return results


def load_pause(wl: Workload, rate_mbit: float, load: float) -> float:
    """The consumer's sleep per batch that makes the loader's demand ``load`` x the link's rate."""
    return wl.batch_bytes / (load * rate_mbit * 125_000)


def measure_reader(reader: Reader, rnd: int, args: argparse.Namespace) -> list[dict]:
    """One reader's sessions on one workload: the load-point epochs (then, warm, capacity and N90
    epochs), and from fresh caches a capacity epoch and an epoch at its N90."""
    wl, rate = reader.wl, reader.env.rate_mbit
    pause = load_pause(wl, rate, wl.load)
    epochs = min(args.epochs, reader.max_epochs or args.epochs)
    steps = [{"label": f"epoch{e + 1}", "order": rnd * 100 + e, "pause_s": pause} for e in range(epochs)]
    # Without a cache every epoch is cold: capacity and N90 then run in the same session.
    state = "warm" if reader.caches else "cold"
    if wl.capacity and reader.capacity:
        steps.append({"label": f"cap-{state}", "order": rnd * 100 + 50, "pause_s": 0.0})
        if args.verify:
            steps.append({"label": f"n90-{state}", "order": rnd * 100 + 51, "verify": True})
    results = run_session(reader, steps, "load")
    if wl.capacity and reader.capacity and reader.caches:
        cold = run_session(reader, [{"label": "cap-cold", "order": rnd * 100 + 60, "pause_s": 0.0}], "cap-cold")
        results += cold
        if args.verify and "n90" in cold[0]:
            n90 = max(1, cold[0]["n90"])
            results += run_session(reader, [{"label": "n90-cold", "order": rnd * 100 + 61, "n": n90}], "n90-cold")
    for r in results:
        r["round"] = rnd
    return results


@contextlib.contextmanager
def hub_with_data(args: argparse.Namespace, work: str, workloads: list[Workload]) -> Iterator[tuple[str, str, tuple[str, str], str]]:
    """The hub, the datasets imported (``wl.commit`` set); yields (REST url, S3 url, S3 keys, admin token)."""
    from bench_checkpoint import Hub
    from bench_s3 import start_hub

    with contextlib.ExitStack() as stack:
        proc, url, s3, token = start_hub(work, args.python)
        stack.callback(stop_process, proc)
        hub = Hub(url, token)
        stack.callback(hub.close)
        for repo, tree in {wl.repo: wl.tree for wl in workloads}.items():
            hub.create_repo(repo)
            out = subprocess.run([*fabric_cmd(args.python), "--server", url, "--token", token, "-q", "--json", "import", tree,
                                  f"{repo}@main", "-m", "bench loader"], env=fabric_env(), cwd=FABRIC_SRC, capture_output=True,
                                 text=True, check=False)
            if out.returncode != 0:
                raise SystemExit(f"import of {repo} failed: {out.stderr[-3000:]}")
            commit = json.loads(out.stdout)["commit_id"]
            for wl in workloads:
                if wl.repo == repo:
                    wl.commit = commit
        yield url, s3, hub.s3_keys(), token


def make_workloads(args: argparse.Namespace) -> list[Workload]:
    data = os.path.join(args.data, "loader")
    out = []
    tree, paths, digests = generate(data, "large", args.large_files, args.large_mib * MiB, args.seed)
    large_size = args.large_files * args.large_mib * MiB
    for name, extra in (("large", {}),
                        ("large-1.5x", {"cache_bytes": int(large_size / 1.5), "load": args.thrash_load, "readers": CACHING,
                                        "capacity": False})):
        if args.workloads and name not in args.workloads:
            continue
        out.append(Workload(**{"name": name, "repo": "loader-large", "paths": paths, "digests": digests, "size": large_size,
                               "batch": 1, "compute_s": args.compute_large, "load": args.load, "tree": tree, **extra}))
    if not args.workloads or "small" in args.workloads:
        tree, paths, digests = generate(data, "small", args.small_files, SMALL_SIZE, args.seed)
        out.append(Workload("small", "loader-small", paths, digests, args.small_files * SMALL_SIZE, 64, args.compute_small,
                            args.load, tree=tree))
    return out


def measure(args: argparse.Namespace, work: str) -> tuple[list[dict], dict[str, str]]:
    from bench_remote import wan

    workloads = make_workloads(args)
    rows: list[dict] = []
    commands: dict[str, str] = {}
    with hub_with_data(args, work, workloads) as (hub_url, hub_s3, keys, token):
        for rate in args.rates:
            with contextlib.ExitStack() as stack:
                links = [stack.enter_context(wan(int(url.rsplit(":", 1)[1]), args.rtt_ms, rate)) for url in (hub_url, hub_s3)]
                env = Env(args, work, hub_url, token, keys, rate, links[0], links[1], fabric_cmd(args.python))
                for rnd in range(args.runs):
                    for wl in workloads:
                        names = [n for n in args.readers if n in wl.readers]
                        k = rnd % len(names)
                        for name in names[k:] + names[:k]:
                            reader = READER_CLASSES[name](env, wl, f"bench-{name}-{wl.name}-{rate:g}-r{rnd}")
                            commands.setdefault(name, reader.describe())
                            rows += measure_reader(reader, rnd, args)
    return rows, commands


# == report =====================================================================================
def med(rows: list[dict], key: str) -> float | None:
    xs = [r[key] for r in rows if r.get(key) is not None]
    return median(xs) if xs else None


def summarize(rows: list[dict]) -> dict:
    """Per rate, workload, reader and epoch label: the medians over rounds; and the prefetch figures."""
    out: dict = {}
    for r in rows:
        cell = out.setdefault(f"{r['rate_mbit']:g}", {}).setdefault(r["workload"], {}).setdefault(r["reader"], {})
        cell.setdefault(r["label"], []).append(r)
    summary: dict = {}
    for rate, wls in out.items():
        for wl, readers in wls.items():
            for reader, labels in readers.items():
                for label, rs in labels.items():
                    s = {k: med(rs, k) for k in ("au", "mb_s", "wan_bytes", "n", "n90", "wall_s", "first_s")}
                    stats = [r["job_stats"] for r in rs if r.get("job_stats")]
                    if stats:
                        s["job_stats"] = stats[-1]
                    hints = [r["hint"] for r in rs if "hint" in r]
                    if hints:
                        s["hint_taken"] = all(h is not None for h in hints)
                    failures = [r["failed"] for r in rs if r.get("failed")]
                    if failures:
                        s["failed"] = failures[-1]
                    summary.setdefault(rate, {}).setdefault(wl, {}).setdefault(reader, {})[label] = s
    return summary


def fig(summary: dict, rate: str, wl: str, reader: str, label: str, key: str):
    return summary.get(rate, {}).get(wl, {}).get(reader, {}).get(label, {}).get(key)


def load_stats(readers: dict) -> dict | None:
    """fabric-hints' job stats at the spoke at the end of its load-point session (taken after its last step)."""
    labels = readers.get("fabric-hints", {})
    for label in ("n90-warm", "cap-warm", *sorted((lab for lab in labels if lab.startswith("epoch")), reverse=True)):
        if labels.get(label, {}).get("job_stats"):
            return labels[label]["job_stats"]
    return None


def prefetch_figures(stats: dict | None, kind: str = "hint") -> tuple[float | None, float | None]:
    """(accuracy, waste) of one kind of prefetch in a job's stats at the spoke."""
    got = (stats or {}).get("prefetch", {}).get(kind) or {}
    fetched = got.get("prefetched_bytes")
    if not fetched:
        return None, None
    return got.get("used_bytes", 0) / fetched, got.get("wasted_bytes", 0) / fetched


def learned_figures(stats: dict | None) -> tuple[float, float | None, float | None] | None:
    """(coverage, accuracy, waste) of the learned prefetch in a job's stats at the spoke."""
    if not stats or not stats.get("demand_bytes"):
        return None
    covered = (stats.get("prefetch", {}).get("learned") or {}).get("covered_bytes", 0)
    return (covered / stats["demand_bytes"], *prefetch_figures(stats, "learned"))


def learned_coverage_bound(k: float) -> float:
    """The most coverage any prefetch can reach in an epoch that reads its files in an order
    it cannot predict (a new random order), when the link could carry ``k`` times the epoch's
    data in the epoch's time (``k`` = link rate / data rate).

    The job reads at a steady rate: a time unit is the epoch, a byte unit its data. The files
    it reads that were not fetched ahead take the link at rate ``1 - c`` (``c``: the share of
    its reads that hit what prefetch fetched); prefetch has the rest, ``k - 1 + c``, and the
    job takes ``c`` of what prefetch holds. So what prefetch holds ahead grows at ``k - 1``
    whatever the order: ``u(t) = (k - 1) t``. A read hits with probability ``u / (1 - t)`` (the
    unread files fetched ahead among the unread files) until ``u`` reaches ``1 - t``, at
    ``t* = 1 / k``; from then on every read hits. Coverage is the mean of that probability over
    the epoch: ``(k - 1)(-t* - ln(1 - t*)) + 1 - t*``. At ``k = 1.25`` (the job reads at 80%
    of the link) that is 40%; 80% needs ``k`` of at least 2.86 (a job reading at 35% of the link
    or less)."""
    if k <= 1:
        return 0.0
    t = 1 / k
    return (k - 1) * (-t - math.log(1 - t)) + 1 - t


def learned_bound(summary: dict, rate: str, wl: str) -> float | None:
    """:func:`learned_coverage_bound` for fabric-learned's first epoch (its measured data rate
    against the link's rate)."""
    mb_s = fig(summary, rate, wl, "fabric-learned", "epoch1", "mb_s")
    if not mb_s:
        return None
    return learned_coverage_bound(float(rate) * 1e6 / 8 / MB / mb_s)


def goals(summary: dict, args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(goal, measured, verdict) for each of the issue's goals, per rate."""
    out = []

    def verdict(ok: bool | None) -> str:
        return "-" if ok is None else ("met" if ok else "**MISSED**")

    for rate in summary:
        for wl, readers in summary[rate].items():
            failed = [v["failed"] for v in readers.get("fabric-hints", {}).values() if v.get("failed")]
            if failed:
                out.append((f"{rate} Mbit/s {wl}: fabric-hints reads the workload", failed[0][:200], verdict(False)))
        for wl in ("large", "small"):
            au = fig(summary, rate, wl, "fabric-hints", "epoch1", "au")
            if au is not None and args.load <= 0.9:
                out.append((f"{rate} Mbit/s {wl}: epoch 1 AU >= 90% at {args.load:.0%} of the link",
                            f"{au:.1%}", verdict(au >= 0.9)))
            for e in range(2, args.epochs + 1):
                au = fig(summary, rate, wl, "fabric-hints", f"epoch{e}", "au")
                wan = fig(summary, rate, wl, "fabric-hints", f"epoch{e}", "wan_bytes")
                if au is not None:
                    # A few bytes cross an idle link (the spoke's watch stream); one chunk is KiBs.
                    out.append((f"{rate} Mbit/s {wl}: epoch {e} (in cache) AU >= 95%, 0 WAN bytes (< 4 KiB: no data)",
                                f"{au:.1%}, {wan:,.0f} B", verdict(au >= 0.95 and wan < 4096)))
            # N90 is proportional to the cold capacity before it is rounded down: the goal compares capacities.
            mine = fig(summary, rate, wl, "fabric-hints", "cap-cold", "mb_s")
            peers = {p: fig(summary, rate, wl, p, "cap-cold", "mb_s") for p in PEERS}
            peers = {p: v for p, v in peers.items() if v}
            if mine is not None and peers:
                best = max(peers, key=peers.get)
                n90 = {r: fig(summary, rate, wl, r, "n90-cold", "n") or fig(summary, rate, wl, r, "cap-cold", "n90")
                       for r in ("fabric-hints", best)}
                out.append((f"{rate} Mbit/s {wl}: accelerators at AU >= 90% (cold) >= 2x best peer's",
                            f"{mine / peers[best]:.2f}x (N90 {n90['fabric-hints']:g} vs {best} {n90[best]:g})",
                            verdict(mine >= 2 * peers[best])))
            learned = learned_figures(fig(summary, rate, wl, "fabric-learned", "epoch1", "job_stats"))
            if learned is not None:
                bound = learned_bound(summary, rate, wl)
                out.append((f"{rate} Mbit/s {wl}: learned working set on a second job: coverage >= 80%",
                            f"{learned[0]:.1%}" + ("" if bound is None else f" (the most any prefetch reaches in that epoch: {bound:.1%})"),
                            verdict(learned[0] >= 0.8)))
            acc, waste = prefetch_figures(load_stats(summary[rate].get(wl, {})))
            if acc is not None:
                out.append((f"{rate} Mbit/s {wl}: hint prefetch accuracy >= 95%, waste <= 5%",
                             f"{acc:.1%}, {waste:.1%}", verdict(acc >= 0.95 and waste <= 0.05)))
        au = fig(summary, rate, "large-1.5x", "fabric-hints", "epoch2", "au")
        theirs = fig(summary, rate, "large-1.5x", "rclone", "epoch2", "au")
        if au is not None and theirs:
            out.append((f"{rate} Mbit/s dataset 1.5x cache: epoch 2 AU >= 1.5x rclone's", f"{au / theirs:.2f}x ({au:.1%} vs {theirs:.1%})",
                        verdict(au >= 1.5 * theirs)))
    return out


ROWS = (("epoch", "au", "AU at the load point", "{:.1%}"), ("epoch", "wan_bytes", "WAN at the load point, MB", "mb"),
        ("epoch", "first_s", "wait for the first batch at the load point, s", "{:.2f}"),
        ("cap-cold", "mb_s", "capacity cold (no compute), MB/s", "{:.1f}"),
        ("cold", "n90", "accelerators at AU >= 90%, cold: N90 (verified AU)", "n90"),
        ("cap-warm", "mb_s", "capacity warm, MB/s", "{:.1f}"), ("warm", "n90", "N90 warm (verified AU)", "n90"))


def cell(summary: dict, rate: str, wl: str, reader: str, label: str, key: str, fmt: str) -> tuple[str, float | None]:
    """A table cell (text, value) of one reader: the median figure, ``failed``, or ``-`` when not measured."""
    labels = (f"cap-{label}", f"n90-{label}") if fmt == "n90" else (label,)
    if any(fig(summary, rate, wl, reader, lab, "failed") for lab in labels):
        return "failed", None
    if fmt == "n90":
        cap = fig(summary, rate, wl, reader, f"cap-{label}", "n90")
        n, au = (fig(summary, rate, wl, reader, f"n90-{label}", k) for k in ("n", "au"))
        if cap is None:
            return "-", None
        n = n if n is not None else cap
        return (f"{n:g}" + ("" if au is None else f" ({au:.0%})")), n
    v = fig(summary, rate, wl, reader, label, key)
    if v is None:
        return "-", None
    return (f"{v / MB:,.1f}" if fmt == "mb" else fmt.format(v)), v


def render(report: dict) -> str:
    p, m, s = report["params"], report["machine"], report["summary"]
    lines = [
        (f"- machine: {m.get('host_cpus')} CPUs ({m.get('cpu', '?')}), {m.get('mem_gib', '?')} GiB RAM, "
         f"{m.get('platform')}, Python {m.get('python')}; {report.get('rclone_version', '')}"),
        f"- fabric at {m.get('fabric_commit')}; load average at the start {report['loadavg']}",
        (f"- WAN: {p['rtt_ms']:g} ms RTT, rates {', '.join(f'{r:g}' for r in p['rates'])} Mbit/s each way (WanProxy; "
         "one link spoke->hub REST, one S3 readers->hub S3); WAN bytes = both directions through the reader's link"),
        (f"- workloads: large {p['large_files']} x {p['large_mib']} MiB, batch 1, compute {p['compute_large']:g} s/batch; "
         f"small {p['small_files']} x 110 KiB, batch 64, compute {p['compute_small']:g} s/batch; large-1.5x: the large "
         f"data set, cache = data / 1.5, load {p['thrash_load']:g}x the link; DataLoader with {p['workers']} workers"),
        (f"- load point: the consumer sleeps so that the data rate asked for is {p['load']:.0%} of the link; "
         f"{p['epochs']} epochs, the first from a fresh cache; N90 = floor(R x compute / 0.9) from a capacity epoch "
         "(no compute, R its batches/s), " + ("then one epoch run at N90 (its AU in brackets)" if p["verify"] else
                                            "not verified by an epoch at N90 (--no-verify)")),
        f"- {p['runs']} round(s), readers' order rotating; medians over rounds; every sample's sha256 checked, each file read once per epoch",
        f"- command: `{report['command']}`",
    ]
    for rate, wls in s.items():
        for wl, readers in wls.items():
            names = [n for n in READERS if n in readers]
            lines += ["", f"**{wl}, {rate} Mbit/s**", "",
                      "| row | " + " | ".join(names) + " | fabric-hints / best peer |", "|---|" + "---:|" * (len(names) + 1)]
            labels = sorted({lab for r in readers.values() for lab in r if lab.startswith("epoch")})
            for label, key, title, fmt in ROWS:
                for lab in (labels if label == "epoch" else [label]):
                    cells = {n: cell(s, rate, wl, n, lab, key, fmt) for n in names}
                    if all(v is None for _, v in cells.values()):
                        continue
                    mine = cells.get("fabric-hints", ("-", None))[1]
                    peers = [v for n, (_, v) in cells.items() if n in PEERS and v is not None]
                    lower_better = key in ("wan_bytes", "first_s")
                    best = (min(peers) if lower_better else max(peers)) if peers else None
                    ratio = f"{mine / best:.2f}" if mine is not None and best else "-"
                    row = title.replace("at the load point", f"{lab}") if label == "epoch" else title
                    lines.append(f"| {row} | " + " | ".join(cells[n][0] for n in names) + f" | {ratio} |")
            stats = load_stats(readers)
            acc, waste = prefetch_figures(stats)
            taken = [lab.get("hint_taken") for lab in readers.get("fabric-hints", {}).values() if "hint_taken" in lab]
            if taken:
                lines += ["", "fabric-hints: the spoke took every epoch's hint" if all(taken) else
                          "fabric-hints: the server did not take the hints (HintingSampler logged why; reads went on without)"]
            if stats:
                lines.append("")
                lines.append(f"fabric-hints at the spoke (job stats after the load session): hit ratio "
                             f"{stats.get('hit_ratio') or 0:.1%}, hint prefetch accuracy "
                             f"{'-' if acc is None else format(acc, '.1%')}, waste {'-' if waste is None else format(waste, '.1%')}, "
                             f"coverage {stats.get('prefetch_coverage') or 0:.1%}, WAN wait {stats.get('wan_wait_seconds', 0):.1f} s")
            learned = learned_figures(fig(s, rate, wl, "fabric-learned", "epoch1", "job_stats"))
            if learned is not None:
                cov, acc, waste = learned
                bound = learned_bound(s, rate, wl)
                lines += ["", f"fabric-learned at the spoke (job stats after epoch 1): learned prefetch coverage {cov:.1%} "
                          f"(demand bytes it had fetched ahead), accuracy {'-' if acc is None else format(acc, '.1%')}, "
                          f"waste {'-' if waste is None else format(waste, '.1%')}"
                          + ("" if bound is None else f"; the most any prefetch reaches in an epoch at that data rate, "
                             f"in an order it cannot predict: {bound:.1%}")]
    failures = [f"- {r['reader']}, {r['workload']}, {r['rate_mbit']:g} Mbit/s, {r['label']} (round {r['round']}): {r['failed']}"
                for r in report["rows"] if r.get("failed")]
    if failures:
        lines += ["", "Readers that failed (the run went on without them):", "", *failures]
    lines += ["", "| goal (issue 14) | measured | verdict |", "| --- | --- | --- |"]
    lines += [f"| {g} | {v} | {ok} |" for g, v, ok in report["goals"]]
    lines += ["", "Commands:", ""] + [f"- {k}: `{v}`" for k, v in report["commands"].items()]
    return "\n".join(lines) + "\n"


# == main =======================================================================================
def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trainer", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="smoke test: small data sets, 1 Gbit/s only, 1 round, no epochs at N90")
    ap.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=None,
                    help="WAN rates to measure, Mbit/s, comma-separated (default 1000,200; quick 1000)")
    ap.add_argument("--rtt-ms", type=float, default=50.0)
    ap.add_argument("--runs", type=int, default=None, help="rounds (default 2, quick 1)")
    ap.add_argument("--epochs", type=int, default=2, help="epochs at the load point per session (>= 2)")
    ap.add_argument("--load", type=float, default=0.8, help="data rate asked for / link rate at the load point (default 0.8)")
    ap.add_argument("--thrash-load", type=float, default=2.0, help="the same for the 1.5x-cache workload (default 2.0)")
    ap.add_argument("--large-files", type=int, default=None, help="default 24 (quick 6)")
    ap.add_argument("--large-mib", type=int, default=None, help="default 32 (quick 8)")
    ap.add_argument("--small-files", type=int, default=None, help="default 3000 (quick 128)")
    ap.add_argument("--compute-large", type=float, default=2.0, help="one accelerator's seconds per large batch (default 2.0)")
    ap.add_argument("--compute-small", type=float, default=0.5, help="one accelerator's seconds per small batch (default 0.5)")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers (default 2)")
    ap.add_argument("--verify", action=argparse.BooleanOptionalAction, default=None,
                    help="run an epoch at the computed N90 to check its AU (default: yes; no with --quick)")
    ap.add_argument("--readers", choices=READERS, action="append", help="only these readers (repeatable)")
    ap.add_argument("--workloads", choices=("large", "small", "large-1.5x"), action="append")
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument("--s3tools", default=os.path.join(REPO_ROOT, ".venv-s3tools"), help="a venv with s3fs (make test builds it)")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--data", default=os.path.join(HERE, "work", "data"))
    ap.add_argument("--work", default=os.path.join(HERE, "work", "stores"))
    ap.add_argument("--keep-work", action="store_true")
    ap.add_argument("--spoke-arg", action="append", default=[], metavar="ARG",
                    help="one more argument for every `fabric spoke` the run starts (repeatable; to compare spoke "
                         "options, e.g. --spoke-arg=--prefetch-window --spoke-arg=256MiB)")
    ap.add_argument("--beside", action="store_true",
                    help="fabric-hints reads the chunks its spoke's cache files hold from them (fabric:// spoke_cache=: a "
                         "loader on the spoke's own machine), not over HTTP")
    ap.add_argument("--json-out")
    ap.add_argument("--md-out")
    args = ap.parse_args()
    q = args.quick
    args.rates = args.rates or ([1000.0] if q else [1000.0, 200.0])
    args.runs = args.runs or (1 if q else 2)
    args.large_files = args.large_files or (6 if q else 24)
    args.large_mib = args.large_mib or (8 if q else 32)
    args.small_files = args.small_files or (128 if q else 3000)
    args.verify = (not q) if args.verify is None else args.verify
    args.readers = args.readers or list(READERS)
    if args.epochs < 2:
        ap.error("--epochs must be at least 2")
    if "s3fs" in args.readers and not os.path.exists(os.path.join(args.s3tools, "bin", "python")):
        print(f"bench_loader.py: no s3fs venv at {args.s3tools} (make test builds it): s3fs left out", file=sys.stderr)
        args.readers.remove("s3fs")
    return args


def main() -> None:
    if "--trainer" in sys.argv:
        trainer(sys.argv[sys.argv.index("--trainer") + 1])
        return
    args = parse_args()
    for tool in ("rclone", "fusermount3"):
        if "rclone" in args.readers and not shutil.which(tool):
            raise SystemExit(f"bench_loader.py: {tool} is not on PATH")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.path.insert(0, FABRIC_SRC)
    work = os.path.join(args.work, "loader")
    remove(work)
    os.makedirs(work)
    load = loadavg()
    rows, commands = measure(args, work)
    if not args.keep_work:
        remove(work)
    summary = summarize(rows)
    report = {
        "machine": machine(),
        "loadavg": load,
        "rclone_version": subprocess.run(["rclone", "version"], capture_output=True, text=True, check=False).stdout.split("\n")[0],
        "params": {k: getattr(args, k) for k in ("rates", "rtt_ms", "runs", "epochs", "load", "thrash_load", "large_files",
                                                 "large_mib", "small_files", "compute_large", "compute_small", "workers",
                                                 "verify", "readers", "seed")},
        "command": " ".join(["python", os.path.relpath(sys.argv[0], os.path.dirname(HERE)), *sys.argv[1:]]),
        "commands": commands,
        "rows": rows,
        "summary": summary,
    }
    report["goals"] = goals(summary, args)
    text = render(report)
    print(text)
    save_report(text, report, args.json_out, args.md_out)


if __name__ == "__main__":
    main()
