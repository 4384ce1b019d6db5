"""``fabric://`` under the data loaders of training jobs (fabric/fsspec/): Hugging Face
``datasets`` (parquet and JSON lines, prepared and streamed), ``webdataset`` tar shards
(through :mod:`fabric.fsspec.wds`) and torch Distributed Checkpoint (``FsspecWriter`` /
``FsspecReader``). Every read is compared with the source; a missing file surfaces as
FileNotFoundError. No test reaches past loopback: ``loopback_only`` refuses and records any
other connection (``datasets`` would otherwise ping its download counter)."""

from __future__ import annotations

import importlib
import io
import json
import random
import socket
import tarfile
from types import ModuleType

import pytest

from fabric.fsspec.wds import FabricShardOpener, register_webdataset
from tests.ci_requirements import missing
from tests.hubserver import Hub, unique_name
from tests.test_fsspec import frames_requests, incompressible, make_token, new_fs, new_repo

LOOPBACK = {"127.0.0.1", "::1", "localhost"}
# Single-process checkpoints (no_dist=True) are what these tests mean to make.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def need(module: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing(f"{module} (the test extra: pip install -e '.[test]'): {exc}")


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch):
    """Refuse connections and name lookups beyond loopback; fail the test if any was tried."""
    tried: list[str] = []
    connect, getaddrinfo = socket.socket.connect, socket.getaddrinfo

    def guarded_connect(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in LOOPBACK:
            tried.append(f"connect {address}")
            raise OSError(f"test is offline: refused to connect to {address}")
        return connect(sock, address)

    def guarded_getaddrinfo(host, *args, **kwargs):
        if host is not None and (host.decode() if isinstance(host, bytes) else host) not in LOOPBACK:
            tried.append(f"resolve {host}")
            raise socket.gaierror(f"test is offline: refused to resolve {host}")
        return getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    monkeypatch.setattr(socket, "getaddrinfo", guarded_getaddrinfo)
    yield
    assert not tried, f"the test tried to reach beyond loopback: {tried}"


@pytest.fixture
def opts(hub: Hub) -> dict[str, str | None]:
    """Storage options, fresh for each test: datasets adds its own keys to the dict it is given."""
    return {"server": hub.url, "token": hub.token}


@pytest.fixture(scope="module")
def fs(hub: Hub):
    return new_fs(hub.url, hub.token)


# -- Hugging Face datasets -----------------------------------------------------------


def rows(shard: int, n: int = 150) -> list[dict]:
    rng = random.Random(shard)
    return [
        {
            "id": shard * 1000 + i,
            "text": f"sample {i} of shard {shard} " + "ab" * rng.randrange(40),
            "score": rng.random(),
            "tokens": [rng.randrange(50_000) for _ in range(rng.randrange(1, 9))],
        }
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def table_repo(hub: Hub, fs) -> tuple[str, list[list[dict]], list[list[dict]]]:
    """Parquet shards under ``train/`` and ``test/``, JSON lines under ``jsonl/``, committed."""
    pd = need("pandas")
    repo = new_repo(hub, "hf")
    parquet = [rows(i) for i in range(3)]
    for i, shard in enumerate(parquet):
        buf = io.BytesIO()
        pd.DataFrame(shard).to_parquet(buf, index=False)
        fs.pipe(f"{repo}@main/train/{i:04d}.parquet", buf.getvalue())
    buf = io.BytesIO()
    pd.DataFrame(rows(9, 40)).to_parquet(buf, index=False)
    fs.pipe(f"{repo}@main/test/0000.parquet", buf.getvalue())
    jsonl = [rows(10 + i, 80) for i in range(2)]
    for i, shard in enumerate(jsonl):
        fs.pipe(f"{repo}@main/jsonl/part-{i}.jsonl", "".join(json.dumps(r) + "\n" for r in shard).encode())
    fs.commit(f"{repo}@main", "tables")
    return repo, parquet, jsonl


@pytest.fixture
def hf(monkeypatch, tmp_path) -> ModuleType:
    """``datasets`` with its caches in ``tmp_path`` and its download counter (a request to the
    Hub) off. Its offline mode stays off here: in offline mode ``datasets`` refuses every
    remote fsspec URL it would download (``fsspec_head``: "Tried to reach"), fabric:// too."""
    for name, value in {
        "HF_HOME": tmp_path / "hf",
        "HF_DATASETS_CACHE": tmp_path / "hf-datasets",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_UPDATE_DOWNLOAD_COUNTS": "0",
    }.items():
        monkeypatch.setenv(name, str(value))
    datasets = need("datasets")
    monkeypatch.setattr(datasets.config, "HF_UPDATE_DOWNLOAD_COUNTS", False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets")
    datasets.disable_progress_bars()
    return datasets


def test_datasets_loads_parquet_and_json_lines(hf, table_repo, opts, tmp_path):
    repo, parquet, jsonl = table_repo
    cache = str(tmp_path / "cache")
    train = hf.load_dataset("parquet", data_files=f"fabric://{repo}@main/train/*.parquet", storage_options=opts, split="train", cache_dir=cache)
    assert train.to_list() == [r for shard in parquet for r in shard]
    # Splits by pattern, on the repository's default branch (REPO/path).
    both = hf.load_dataset(
        "parquet",
        data_files={"train": f"fabric://{repo}/train/000[01].parquet", "test": f"fabric://{repo}/test/*.parquet"},
        storage_options=opts,
        cache_dir=cache,
    )
    assert both["train"].to_list() == parquet[0] + parquet[1] and both["test"].to_list() == rows(9, 40)
    # ** patterns match at any depth (files in name order: test/ before train/). datasets'
    # data_dir= is no help: it resolves it as a local path, whatever its protocol.
    every = hf.load_dataset("parquet", data_files=f"fabric://{repo}@main/**/*.parquet", storage_options=opts, split="train", cache_dir=cache)
    assert every.to_list() == rows(9, 40) + [r for shard in parquet for r in shard]
    lines = hf.load_dataset("json", data_files=f"fabric://{repo}@main/jsonl/*.jsonl", storage_options=opts, split="train", cache_dir=cache)
    assert lines.to_list() == jsonl[0] + jsonl[1]


def test_datasets_loads_pinned_versions(hub: Hub, hf, fs, opts, tmp_path):
    """datasets keeps a downloaded data file under its URL alone (``use_etag=False``), so a
    branch URL keeps loading what it first downloaded; ``fs.pin`` names the commit instead:
    an unchanged version loads from the cache, each new commit loads anew, an old one as it was."""
    pd = need("pandas")
    repo = new_repo(hub, "hfcache")
    cache = str(tmp_path / "cache")

    def commit(shard: int) -> list[dict]:
        buf = io.BytesIO()
        pd.DataFrame(rows(shard)).to_parquet(buf, index=False)
        fs.pipe(f"{repo}@main/data/part.parquet", buf.getvalue())
        fs.commit(f"{repo}@main", f"shard {shard}")
        return rows(shard)

    def load(url: str, **kwargs) -> list[dict]:
        return hf.load_dataset("parquet", data_files=url, storage_options=opts, split="train", cache_dir=cache, **kwargs).to_list()

    before = commit(1)
    first = fs.pin(f"fabric://{repo}@main/data/*.parquet")
    head = hub.plane().resolve_commit(repo, "main")
    assert first == f"fabric://{repo}@{head}/data/*.parquet" and fs.pin(repo) == f"{repo}@{head}"
    assert load(first) == before
    reads = frames_requests(hub.metrics())
    assert load(first) == before and frames_requests(hub.metrics()) == reads  # from the cache
    after = commit(2)
    assert load(fs.pin(f"fabric://{repo}@main/data/*.parquet")) == after
    assert load(first) == before
    # A branch URL, once cached, needs datasets told to download again.
    assert load(f"fabric://{repo}@main/data/*.parquet", download_mode="force_redownload") == after
    with pytest.raises(FileNotFoundError):
        fs.pin(f"{repo}@no-such-branch/data")
    with pytest.raises(ValueError):
        fs.pin("fabric://")


def test_datasets_streams_in_offline_mode(hf, table_repo, opts, monkeypatch):
    """Streaming opens each file through fsspec as it iterates, which offline mode allows."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hf.config, "HF_HUB_OFFLINE", True)
    repo, parquet, jsonl = table_repo
    stream = hf.load_dataset("parquet", data_files=f"fabric://{repo}@main/train/*.parquet", storage_options=opts, split="train", streaming=True)
    assert list(stream) == [r for shard in parquet for r in shard]
    stream = hf.load_dataset("json", data_files=f"fabric://{repo}@main/jsonl/part-1.jsonl", storage_options=opts, split="train", streaming=True)
    assert list(stream) == jsonl[1]


def test_datasets_missing_files_raise_file_not_found(hub: Hub, hf, table_repo, opts, tmp_path):
    repo, _, _ = table_repo
    cache = str(tmp_path / "cache")
    for url in (
        f"fabric://{repo}@main/train/missing.parquet",
        f"fabric://{repo}@no-such-branch/train/0000.parquet",
        f"fabric://{unique_name('nope')}@main/train/0000.parquet",
    ):
        for streaming in (False, True):
            with pytest.raises(FileNotFoundError, match="Unable to find"):
                hf.load_dataset("parquet", data_files=url, storage_options=opts, split="train", cache_dir=cache, streaming=streaming)
    # A pattern that matches nothing is datasets' own error (it drops the FileNotFoundError
    # of a pattern, as it does for local files); the file system did raise it.
    with pytest.raises(ValueError, match="data_files are invalid"):
        hf.load_dataset("parquet", data_files=f"fabric://{repo}@no-such-branch/train/*.parquet", storage_options=opts, split="train", cache_dir=cache)
    with pytest.raises(FileNotFoundError, match="no-such-branch"):
        new_fs(hub.url, hub.token).glob(f"fabric://{repo}@no-such-branch/train/*.parquet")
    # A token for another repository learns nothing about this one.
    other = new_repo(hub, "hfother")
    stranger = {"server": hub.url, "token": make_token(hub, unique_name("stranger"), {other: "read"})}
    with pytest.raises(PermissionError):
        hf.load_dataset("parquet", data_files=f"fabric://{repo}@main/train/*.parquet", storage_options=stranger, split="train", cache_dir=cache)


# -- webdataset ----------------------------------------------------------------------


def make_samples(shard: int, n: int = 6) -> dict[str, dict[str, bytes]]:
    """``n`` samples of ``txt``, ``cls`` and ``bin`` fields (some bin fields span several chunks)."""
    return {
        f"s{shard:02d}-{i:03d}": {
            "txt": f"caption {i} of shard {shard}".encode(),
            "cls": str(i % 3).encode(),
            "bin": incompressible((300_000 if i == 0 else 5_000) + i, shard * 100 + i),
        }
        for i in range(n)
    }


def tar_of(samples: dict[str, dict[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for key, fields in samples.items():
            for ext, data in fields.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture(scope="module")
def shard_repo(hub: Hub, fs) -> tuple[str, dict[str, dict[str, bytes]]]:
    repo = new_repo(hub, "wds")
    source: dict[str, dict[str, bytes]] = {}
    for shard in range(4):
        samples = make_samples(shard)
        fs.pipe(f"{repo}@main/shards/train-{shard:06d}.tar", tar_of(samples))
        source.update(samples)
    fs.commit(f"{repo}@main", "shards")
    return repo, source


@pytest.fixture
def wds(monkeypatch, opts) -> ModuleType:
    """webdataset with ``fabric://`` registered for this test (the registration is undone after)."""
    webdataset = need("webdataset")
    gopen = importlib.import_module("webdataset.gopen")
    monkeypatch.setitem(gopen.gopen_schemes, "fabric", gopen.gopen_error)
    register_webdataset(**opts)
    return webdataset


def fields_of(sample: dict) -> tuple[str, dict[str, bytes]]:
    return sample["__key__"], {k: v for k, v in sample.items() if not k.startswith("__")}


def test_webdataset_reads_shards(wds, shard_repo):
    repo, source = shard_repo
    url = f"fabric://{repo}@main/shards/train-{{000000..000003}}.tar"
    got = [fields_of(s) for s in wds.WebDataset(url, shardshuffle=False)]
    assert got == list(source.items())
    # Decoded, as a training loop would take them.
    first = next(iter(wds.WebDataset(url, shardshuffle=False).decode()))
    assert first["txt"] == "caption 0 of shard 0" and first["cls"] == 0


def test_webdataset_in_dataloader_workers(wds, shard_repo):
    """Forked workers each open the shards given to them with a file system of their own."""
    torch_data = need("torch.utils.data")
    repo, source = shard_repo
    dataset = wds.WebDataset(f"fabric://{repo}@main/shards/train-{{000000..000003}}.tar", shardshuffle=False)
    loader = torch_data.DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="fork")
    got = dict(fields_of(s) for s in loader)
    assert got == source


def test_webdataset_writes_shards_to_a_branch(hub: Hub, wds, fs):
    repo = new_repo(hub, "wdsw")
    samples = make_samples(7, 4)
    with wds.TarWriter(f"fabric://{repo}@main/out/shard-0.tar") as sink:
        for key, fields in samples.items():
            sink.write({"__key__": key, **fields})
    assert [c.path for c in hub.plane().uncommitted(repo, "main")] == ["out/shard-0.tar"]  # staged
    got = [fields_of(s) for s in wds.WebDataset(f"fabric://{repo}@main/out/shard-0.tar", shardshuffle=False)]
    assert got == list(samples.items())


def test_webdataset_missing_shard_raises_file_not_found(wds, shard_repo, opts):
    repo, _ = shard_repo
    with pytest.raises(FileNotFoundError, match="train-000009.tar"):
        list(wds.WebDataset(f"fabric://{repo}@main/shards/train-000009.tar", shardshuffle=False))
    with pytest.raises(ValueError, match="mode"):
        FabricShardOpener(**opts)(f"fabric://{repo}@main/shards/train-000000.tar", "ab")


# -- torch Distributed Checkpoint ----------------------------------------------------


@pytest.fixture
def dcp() -> ModuleType:
    return need("torch.distributed.checkpoint")


def trained(seed: int):
    """A small model and its Adam optimizer after one step: a state dict with optimizer state."""
    torch = need("torch")
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    optim = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(16, 32)).square().mean().backward()
    optim.step()
    return model, optim


def checkpoint(model, optim, step: int) -> dict:
    return {"model": model.state_dict(), "optim": optim.state_dict(), "extra": {"step": step, "note": f"step {step}"}}


def assert_same(a, b) -> None:
    torch = need("torch")
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    else:
        assert a == b


def load_into(dcp, url: str, opts: dict, seed: int) -> dict:
    """A fresh model and optimizer (of other weights) loaded from the checkpoint at ``url``."""
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    model, optim = trained(seed)
    state = checkpoint(model, optim, -1)
    dcp.load(state, storage_reader=FsspecReader(url, **opts), no_dist=True)
    model.load_state_dict(state["model"])
    optim.load_state_dict(state["optim"])
    return {"model": model.state_dict(), "optim": optim.state_dict(), "extra": state["extra"]}


def test_dcp_saves_to_a_branch_and_loads_back(hub: Hub, dcp, fs, opts):
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    repo = new_repo(hub, "dcp")
    url = f"fabric://{repo}@main/ckpt/step1"
    saved = checkpoint(*trained(1), step=1)
    dcp.save(saved, storage_writer=FsspecWriter(url, **opts), no_dist=True)
    # Staged on the branch (the temporary metadata file was renamed into place), not yet history.
    assert fs.ls(url[len("fabric://") :], detail=False) == [f"{repo}@main/ckpt/step1/.metadata", f"{repo}@main/ckpt/step1/__0_0.distcp"]
    assert sorted(c.path for c in hub.plane().uncommitted(repo, "main")) == ["ckpt/step1/.metadata", "ckpt/step1/__0_0.distcp"]
    assert_same(load_into(dcp, url, opts, seed=2), saved)
    step1 = fs.commit(f"{repo}@main", "checkpoint 1")
    # Overwritten in place by a later save (many files, two writer threads), then committed.
    later = checkpoint(*trained(3), step=2)
    writer = FsspecWriter(url, single_file_per_rank=False, thread_count=2, sync_files=False, **opts)
    with pytest.warns(UserWarning, match="existing checkpoint"):  # it found step 1's .metadata
        dcp.save(later, storage_writer=writer, no_dist=True)
    fs.commit(f"{repo}@main", "checkpoint 2")
    assert_same(load_into(dcp, url, opts, seed=4), later)
    assert_same(load_into(dcp, f"fabric://{repo}@{step1}/ckpt/step1", opts, seed=5), saved)


def test_dcp_finds_fabric_urls_by_checkpoint_id(hub: Hub, dcp, monkeypatch):
    """With ``checkpoint_id`` torch picks the fsspec reader and writer itself; the file
    system then takes its server and token from the environment."""
    torch = need("torch")
    monkeypatch.setenv("FABRIC_SERVER", hub.url)
    monkeypatch.setenv("FABRIC_TOKEN", hub.token)
    repo = new_repo(hub, "dcpid")
    url = f"fabric://{repo}@main/ckpt/by-id"
    saved = {"w": torch.randn(128, 64), "ids": torch.arange(1000)}
    dcp.save(saved, checkpoint_id=url, no_dist=True)
    loaded = {"w": torch.zeros(128, 64), "ids": torch.zeros(1000, dtype=torch.long)}
    dcp.load(loaded, checkpoint_id=url, no_dist=True)
    assert_same(loaded, saved)


def test_dcp_errors_surface_and_change_nothing(hub: Hub, dcp, fs, opts):
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

    torch = need("torch")
    repo = new_repo(hub, "dcperr")
    fs.pipe(f"{repo}@main/keep", b"x")
    fs.commit(f"{repo}@main", "one file")
    hub.plane().create_tag(repo, "v1", "main")
    missing_url = f"fabric://{repo}@main/ckpt/never-saved"
    with pytest.raises(FileNotFoundError, match="never-saved"):
        FsspecReader(missing_url, **opts).read_metadata()
    with pytest.raises(dcp.api.CheckpointException, match="no such file or directory"):
        dcp.load({"w": torch.zeros(3)}, storage_reader=FsspecReader(missing_url, **opts), no_dist=True)
    with pytest.raises(dcp.api.CheckpointException, match="tags are read-only"):
        dcp.save({"w": torch.ones(3)}, storage_writer=FsspecWriter(f"fabric://{repo}@v1/ckpt", **opts), no_dist=True)
    assert not list(hub.plane().uncommitted(repo, "main"))
    assert fs.find(f"{repo}@v1") == [f"{repo}@v1/keep"]
