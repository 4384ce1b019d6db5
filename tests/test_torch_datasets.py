"""PyTorch datasets (fabric/torch/) against a real hub and spoke on loopback (torch extra):
the map-style file dataset through DataLoader workers, the iterable shard dataset over tar
and parquet shards split across workers and ranks (simulated and a real 2-process gloo
world), epoch shuffles, read-order hints sent by HintingSampler, and hints that fail."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import pickle
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.hubserver import ROOT, Hub, metric_value, unique_name
from tests.spokeserver import start_spoke, wait_for

torch = pytest.importorskip("torch", reason="torch is an optional extra: pip install -e '.[torch]'")
pq = pytest.importorskip("pyarrow.parquet")
import pyarrow as pa  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler  # noqa: E402

import fabric.torch  # noqa: E402
from fabric import errors  # noqa: E402
from fabric.fsspec import FabricFileSystem  # noqa: E402
from fabric.torch import FabricFileDataset, FabricShardDataset, HintingSampler  # noqa: E402
from fabric.util.net import free_port  # noqa: E402

FILES = 40
TAR_SHARDS, TAR_PER_SHARD = 6, 5
PQ_SHARDS, PQ_PER_SHARD = 5, 7


def file_body(i: int) -> bytes:
    return f"file {i}\n".encode() * (50 + 37 * i)


def decode_file(data: bytes, path: str) -> tuple[str, int, int]:
    """A sample: (path, the number the file holds, its length)."""
    return path, int(data.split(b"\n", 1)[0].split()[1]), len(data)


def tar_shard(shard: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(TAR_PER_SHARD):
            key = f"s{shard:02d}/x{i:03d}"
            for ext, body in (("txt", f"text {shard} {i}".encode()), ("cls", str(shard * 100 + i).encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
    return buf.getvalue()


def parquet_shard(shard: int) -> bytes:
    ids = [shard * 100 + i for i in range(PQ_PER_SHARD)]
    buf = io.BytesIO()
    pq.write_table(pa.table({"id": ids, "text": [f"row {n}" for n in ids]}), buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def data_repo(hub: Hub) -> str:
    """A repository with FILES small files, tar shards and parquet shards, committed on main."""
    repo = unique_name("torchds")
    hub.plane().create_repo(repo)
    fs = FabricFileSystem(server=hub.url, token=hub.token, skip_instance_cache=True)
    for i in range(FILES):
        fs.pipe_file(f"{repo}@main/files/c{i % 3}/{i:03d}.bin", file_body(i))
    fs.pipe_file(f"{repo}@main/files/README.md", b"not a sample")
    for s in range(TAR_SHARDS):
        fs.pipe_file(f"{repo}@main/tar/shard-{s:03d}.tar", tar_shard(s))
    for s in range(PQ_SHARDS):
        fs.pipe_file(f"{repo}@main/pq/part-{s:03d}.parquet", parquet_shard(s))
    fs.commit(f"{repo}@main", "datasets")
    return repo


def expected_files() -> dict[str, tuple[str, int, int]]:
    return {f"files/c{i % 3}/{i:03d}.bin": (f"files/c{i % 3}/{i:03d}.bin", i, len(file_body(i))) for i in range(FILES)}


def as_list(batch):
    return batch


def test_importing_fabric_does_not_import_torch() -> None:
    code = "import sys, fabric, fabric.fsspec, fabric.client.http, fabric.cli.main; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=120).returncode == 0


# -- the map-style dataset -------------------------------------------------------------
def entry_requests(hub: Hub) -> float:
    return metric_value(hub.metrics(), "fabric_http_requests_total", method="GET", route="/api/v1/repos/{repo}/refs/{ref}/entry")



def test_file_dataset_through_two_workers(hub: Hub, data_repo: str) -> None:
    ds = FabricFileDataset(f"fabric://{data_repo}@main/files", decode=decode_file, server=hub.url, token=hub.token, suffixes=[".bin"])
    want = expected_files()
    assert ds.paths == sorted(want) and len(ds) == FILES
    assert ds.sizes == [want[p][2] for p in ds.paths]
    # The ref was pinned to its commit: a later commit on main changes nothing the dataset reads.
    FabricFileSystem(server=hub.url, token=hub.token, commit="change", skip_instance_cache=True).pipe_file(
        f"{data_repo}@main/files/c0/000.bin", b"file 999\n"
    )
    try:
        entries = entry_requests(hub)
        loader = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=as_list, sampler=RandomSampler(ds))
        got = [sample for batch in loader for sample in batch]
        assert sorted(got) == sorted(want.values())
        assert ds[5] == want[ds.paths[5]]  # single reads too, in this process
        # The workers read with the entries the dataset's listing gave: no entry asked for.
        assert entry_requests(hub) == entries
    finally:
        FabricFileSystem(server=hub.url, token=hub.token, commit="restore", skip_instance_cache=True).pipe_file(
            f"{data_repo}@main/files/c0/000.bin", file_body(0)
        )


def test_file_dataset_refuses_bad_input(hub: Hub, data_repo: str) -> None:
    kw = {"server": hub.url, "token": hub.token}
    with pytest.raises(FileNotFoundError, match="no files"):
        FabricFileDataset(f"{data_repo}@main/nothing-here", **kw)
    with pytest.raises(FileNotFoundError, match=r"ending in \.jpg"):
        FabricFileDataset(f"{data_repo}@main/files", suffixes=".jpg", **kw)
    with pytest.raises(FileNotFoundError):
        FabricFileDataset(f"{data_repo}@no-such-branch/files", **kw)
    with pytest.raises(FileNotFoundError):
        FabricFileDataset(f"{unique_name('missing')}@main/files", **kw)
    with pytest.raises(ValueError, match="name a repository"):
        FabricFileDataset("fabric://", **kw)
    with pytest.raises(ValueError, match="job id"):
        FabricFileDataset(f"{data_repo}@main/files", job="has space", **kw)
    with pytest.raises(ValueError, match="no server"):
        FabricFileDataset(f"{data_repo}@main/files", server="", token=hub.token)
    # Another repository's token learns nothing: the repository looks absent.
    with hub.client() as c:
        other = unique_name("other")
        hub.plane().create_repo(other)
        r = c.post("/api/v1/tokens", json={"name": unique_name("t"), "roles": {other: "read"}})
        assert r.status_code == 201, r.text
    with pytest.raises((FileNotFoundError, PermissionError)):
        FabricFileDataset(f"{data_repo}@main/files", server=hub.url, token=r.json()["token"])


# -- the iterable shard dataset ----------------------------------------------------------


def tar_sample_id(sample: dict) -> int:
    assert sample["txt"].decode().startswith("text ") and sample["__url__"].endswith(".tar")
    shard, i = (int(n) for n in sample["txt"].split()[1:])
    assert sample["__key__"] == f"s{shard:02d}/x{i:03d}"
    assert int(sample["cls"]) == shard * 100 + i
    return shard * 100 + i


def pq_sample_id(row: dict) -> int:
    assert row["text"] == f"row {row['id']}"
    return row["id"]


SHARDS = {
    "tar": ("tar", TAR_SHARDS, TAR_PER_SHARD, tar_sample_id),
    "parquet": ("pq", PQ_SHARDS, PQ_PER_SHARD, pq_sample_id),
}


@pytest.mark.parametrize("kind", ["tar", "parquet"])
def test_shards_split_across_workers_and_ranks(hub: Hub, data_repo: str, kind: str) -> None:
    folder, shards, per_shard, sample_id = SHARDS[kind]
    everything = sorted(s * 100 + i for s in range(shards) for i in range(per_shard))
    orders = []
    for epoch in range(2):
        seen: list[int] = []
        order: list[str] = []
        for rank in range(2):
            ds = FabricShardDataset(f"fabric://{data_repo}@main/{folder}/", shuffle_shards=11, rank=rank, world_size=2, server=hub.url, token=hub.token)
            assert ds.kind == kind
            ds.set_epoch(epoch)
            for sample in DataLoader(ds, batch_size=None, num_workers=2):
                seen.append(sample_id(sample))
                if kind == "tar" and sample["__url__"] not in order:
                    order.append(sample["__url__"])
            order += [s for w in range(2) for s in ds.shards_of(rank, 2, w, 2)]
        assert sorted(seen) == everything, f"epoch {epoch}: every sample exactly once"
        orders.append(order)
    assert orders[0] != orders[1], "the shard order changes with the epoch"


def test_shard_dataset_takes_a_list_and_refuses_bad_input(hub: Hub, data_repo: str) -> None:
    kw = {"server": hub.url, "token": hub.token}
    urls = [f"{data_repo}@main/pq/part-{s:03d}.parquet" for s in (3, 1)]
    rows = list(FabricShardDataset(urls, decode=lambda r: r["id"], **kw))
    assert rows == [300 + i for i in range(PQ_PER_SHARD)] + [100 + i for i in range(PQ_PER_SHARD)]
    with pytest.raises(FileNotFoundError, match=r"no files ending in \.tar"):
        FabricShardDataset(f"{data_repo}@main/files", **kw)  # neither .tar nor .parquet
    with pytest.raises(ValueError, match="pass kind="):
        FabricShardDataset(f"{data_repo}@main", **kw)  # both
    assert len(FabricShardDataset(f"{data_repo}@main", kind="tar", **kw).shards) == TAR_SHARDS
    with pytest.raises(ValueError, match="kind must be"):
        FabricShardDataset(urls, kind="zip", **kw)
    with pytest.raises(ValueError, match="both rank"):
        FabricShardDataset(urls, rank=1, **kw)
    with pytest.raises(ValueError, match="rank must be"):
        FabricShardDataset(urls, rank=2, world_size=2, **kw)
    with pytest.raises(ValueError, match="no shards"):
        FabricShardDataset([], **kw)
    with pytest.raises(ValueError, match="not a shard file"):
        FabricShardDataset([f"{data_repo}@main"], **kw)


# -- a real world of two ranks (gloo on loopback) ----------------------------------------


def _rank_main(rank: int, port: int, url: str, token: str, repo: str, out: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        # Workers forked as under torchrun (mp.spawn's children would spawn theirs: seconds each).
        fork = {"num_workers": 2, "multiprocessing_context": "fork"}
        files = FabricFileDataset(f"{repo}@main/files", decode=decode_file, server=url, token=token, suffixes=[".bin"], job="gloo-test")
        sampler = HintingSampler(DistributedSampler(files, shuffle=True, seed=5), files)
        loader = DataLoader(files, sampler=sampler, batch_size=3, collate_fn=as_list, **fork)
        shards = FabricShardDataset(f"{repo}@main/tar", shuffle_shards=3, server=url, token=token, job="gloo-test")
        spawned = pickle.loads(pickle.dumps(shards))  # as a spawned worker gets it: the rank comes along
        result: dict = {"files": [], "tar": [], "hints": [], "job": files.source.job, "pickled_rank": [spawned.rank, spawned.world_size]}
        for epoch in range(2):
            sampler.set_epoch(epoch)
            result["files"].append([s[0] for batch in loader for s in batch])
            result["hints"].append(sampler.last_hint)
            shards.set_epoch(epoch)
            result["tar"].append([s["__key__"] for s in DataLoader(shards, batch_size=None, **fork)])
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
    finally:
        torch.distributed.destroy_process_group()
    # torch's C++ teardown at interpreter exit now and then aborts a rank ("terminate called
    # without an active exception"); the work under test is done, so leave without it.
    os._exit(0)


def test_distributed_sampler_in_a_gloo_world(hub: Hub, data_repo: str, tmp_path) -> None:
    torch.multiprocessing.spawn(_rank_main, args=(free_port(), hub.url, hub.token, data_repo, str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["job"] for r in ranks] == ["gloo-test:r0", "gloo-test:r1"]
    assert [r["pickled_rank"] for r in ranks] == [[0, 2], [1, 2]]
    all_files = sorted(expected_files())
    all_keys = sorted(f"s{s:02d}/x{i:03d}" for s in range(TAR_SHARDS) for i in range(TAR_PER_SHARD))
    for epoch in range(2):
        assert sorted(ranks[0]["files"][epoch] + ranks[1]["files"][epoch]) == all_files
        assert sorted(ranks[0]["tar"][epoch] + ranks[1]["tar"][epoch]) == all_keys
    assert ranks[0]["files"][0] != ranks[0]["files"][1]
    # Each rank hinted its own half of each epoch, under its own job id (the hub only checks hints).
    assert [[h and (h["job"], h["paths"]) for h in r["hints"]] for r in ranks] == [[(f"gloo-test:r{n}", FILES // 2)] * 2 for n in range(2)]
    assert any(r["tar"][0] != r["tar"][1] for r in ranks), "the shard order changes with the epoch"


# -- hints ---------------------------------------------------------------------------------


def test_hint_for_a_mount_reader(hub: Hub, data_repo: str, monkeypatch) -> None:
    paths = [f"files/c{i % 3}/{i:03d}.bin" for i in (7, 3, 7, 30)]  # a file may come again
    answer = fabric.torch.hint(hub.url, data_repo, "main", paths, token=hub.token, job="mount-job")
    assert answer == {"job": "mount-job", "paths": 4, "bytes": 2 * len(file_body(7)) + len(file_body(3)) + len(file_body(30)), "window_bytes": 0}
    monkeypatch.setenv("FABRIC_JOB", "env-job")
    assert fabric.torch.hint(hub.url, data_repo, "main", paths[:1], token=hub.token)["job"] == "env-job"
    monkeypatch.delenv("FABRIC_JOB")
    with pytest.raises(ValueError, match="FABRIC_JOB"):
        fabric.torch.hint(hub.url, data_repo, "main", paths, token=hub.token)
    with pytest.raises(errors.NotFound, match="files/nope.bin"):
        fabric.torch.hint(hub.url, data_repo, "main", ["files/c0/000.bin", "files/nope.bin"], token=hub.token, job="mount-job")
    with pytest.raises(errors.NotFound):
        fabric.torch.hint(hub.url, data_repo, "main", ["files"], token=hub.token, job="mount-job")  # a directory
    with pytest.raises(errors.BadRequest):
        fabric.torch.hint(hub.url, data_repo, "main", paths, token=hub.token, job="bad job")


class _RefusingProxy(BaseHTTPRequestHandler):
    """Forwards every request to the hub but answers 503 to hints (a server that refuses them);
    with ``hint_delay``, forwards hints too, that many seconds late (a slow server)."""

    target = ""
    refused = 0
    hint_delay: float | None = None

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        hint = self.path.split("?")[0].endswith("/hints")
        if hint and self.hint_delay is not None:
            time.sleep(self.hint_delay)
        if hint and self.hint_delay is None:
            type(self).refused += 1
            payload = b'{"error": {"message": "hints are off here", "code": "unavailable"}}'
            self.send_response(503)
        else:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length", "connection")}
            r = httpx.request(self.command, self.target + self.path, headers=headers, content=body, timeout=60)
            payload = r.content
            self.send_response(r.status_code)
            for k, v in r.headers.items():
                if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding", "date", "server"):
                    self.send_header(k, v)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def hint_proxy(hub: Hub, **attrs) -> Iterator[tuple[str, type[_RefusingProxy]]]:
    """A :class:`_RefusingProxy` in front of ``hub`` (class attributes ``attrs``): its URL and handler class."""
    handler = type("Proxy", (_RefusingProxy,), {"target": hub.url, "refused": 0, **attrs})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def test_an_epoch_does_not_wait_for_its_hint(hub: Hub, data_repo: str) -> None:
    """The hint is sent beside the reads: the sampler yields at once although the server takes
    2 s to answer it; ``last_hint`` waits for the answer."""
    with hint_proxy(hub, hint_delay=2.0) as (url, _):
        ds = FabricFileDataset(f"{data_repo}@main/files", decode=decode_file, server=url, token=hub.token, suffixes=[".bin"])
        sampler = HintingSampler(RandomSampler(ds), ds)
        started = time.monotonic()
        first = next(iter(sampler))
        assert ds[first] == expected_files()[ds.paths[first]]
        assert time.monotonic() - started < 1.5
        assert sampler.last_hint is not None and sampler.last_hint["paths"] == FILES
        assert time.monotonic() - started >= 2.0


def test_a_refused_hint_does_not_stop_training(hub: Hub, data_repo: str, caplog) -> None:
    with hint_proxy(hub) as (url, handler):
        ds = FabricFileDataset(f"{data_repo}@main/files", decode=decode_file, server=url, token=hub.token, suffixes=[".bin"])
        sampler = HintingSampler(RandomSampler(ds), ds)
        with caplog.at_level(logging.WARNING, logger="fabric.torch"):
            for _ in range(2):  # two epochs: two refusals, one warning
                got = [s for batch in DataLoader(ds, sampler=sampler, batch_size=8, collate_fn=as_list) for s in batch]
                assert sorted(got) == sorted(expected_files().values())
                assert sampler.last_hint is None
        assert handler.refused == 2
        warnings = [r for r in caplog.records if r.name == "fabric.torch"]
        assert len(warnings) == 1 and "hint" in warnings[0].getMessage(), warnings
        # The shard dataset too: samples flow although its hint is refused.
        shards = FabricShardDataset(f"{data_repo}@main/pq", server=url, token=hub.token)
        assert len(list(shards)) == PQ_SHARDS * PQ_PER_SHARD
        assert handler.refused == 3


def test_hinting_sampler_sends_the_epoch_order_to_the_spoke(hub: Hub, data_repo: str, tmp_path) -> None:
    """The spoke gets the sampler's permutation: it fetches the head of that order (within its
    16 KiB window) before anything is read, and not its tail."""
    job = f"hint-{uuid.uuid4().hex[:8]}"
    with start_spoke(hub.url, tmp_path / "cache", "256MiB", token=hub.token, args=["--hint-window", "16KiB"]) as spoke:
        ds = FabricFileDataset(f"{data_repo}@main/files", decode=decode_file, server=spoke.url, token=hub.token, job=job, suffixes=[".bin"])
        sampler = HintingSampler(RandomSampler(ds, generator=torch.Generator().manual_seed(1)), ds)
        order = list(sampler)
        assert sorted(order) == list(range(FILES)) and order != sorted(order)
        assert sampler.last_hint == {"job": job, "paths": FILES, "bytes": sum(ds.sizes), "window_bytes": 16 * 1024}

        def job_stats(name: str) -> dict:
            return spoke.stats().get("jobs", {}).get(name, {})

        wait_for(lambda: job_stats(job).get("prefetch", {}).get("hint", {}).get("prefetched_bytes", 0) >= ds.sizes[order[0]])
        probe = FabricFileSystem(server=spoke.url, token=hub.token, job=f"{job}-probe", skip_instance_cache=True)
        probe.cat_file(ds.url(order[-1]))  # the tail of the order: not fetched ahead
        assert job_stats(f"{job}-probe")["hit_bytes"] == 0
        probe.cat_file(ds.url(order[0]))  # the head: already in the cache
        assert job_stats(f"{job}-probe")["hit_bytes"] > 0

        got = [s for batch in DataLoader(ds, sampler=sampler, batch_size=4, num_workers=2, collate_fn=as_list) for s in batch]
        assert sorted(got) == sorted(expected_files().values())
        assert job_stats(job)["demand_bytes"] > 0
