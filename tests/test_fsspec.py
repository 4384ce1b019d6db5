"""``fabric://`` for fsspec (fabric/fsspec/): fsspec's own abstract test suite, reads equal to
the source, random access, batched ``cat_ranges`` counted at the hub, writes to a branch and
their commits, errors fsspec users expect, pandas and pyarrow, and reads through a spoke."""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import random
import time

import fsspec
import pytest
from fsspec.tests import abstract

from fabric.format.chunking import MAX_CHUNK
from fabric.fsspec import FabricFileSystem
from fabric.fsspec.files import DEFAULT_BLOCK_SIZE
from tests.ci_requirements import missing
from tests.hubserver import Hub, metric_value, unique_name
from tests.spokeserver import start_spoke

FRAMES_ROUTE = "/api/v1/chunks/frames"


def new_fs(url: str, token: str | None, **kwargs) -> FabricFileSystem:
    return fsspec.filesystem("fabric", server=url, token=token, skip_instance_cache=True, **kwargs)


def new_repo(hub: Hub, stem: str = "fs") -> str:
    name = unique_name(stem)
    hub.plane().create_repo(name)
    return name


def make_token(hub: Hub, name: str, roles: dict[str, str]) -> str:
    with hub.client() as c:
        r = c.post("/api/v1/tokens", json={"name": name, "roles": roles})
        assert r.status_code == 201, r.text
        return r.json()["token"]


def frames_requests(metrics_text: str) -> float:
    return metric_value(metrics_text, "fabric_http_requests_total", route=FRAMES_ROUTE)


def incompressible(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


# -- fsspec's abstract test suite ------------------------------------------------


@pytest.fixture(scope="module")
def admin_fs(hub: Hub) -> FabricFileSystem:
    return new_fs(hub.url, hub.token)


@pytest.fixture(scope="module")
def abstract_repo(hub: Hub) -> str:
    return new_repo(hub, "abstract")


class FabricFixtures(abstract.AbstractFixtures):
    """fsspec's fixtures over a fresh directory of one repository's main branch."""

    @pytest.fixture
    def fs(self, admin_fs: FabricFileSystem) -> FabricFileSystem:
        return admin_fs

    @pytest.fixture
    def fs_path(self, abstract_repo: str) -> str:
        return f"{abstract_repo}@main/{unique_name('t')}"

    @pytest.fixture
    def fs_join(self):
        return posixpath.join

    @pytest.fixture
    def supports_empty_directories(self) -> bool:
        return False  # an object store: a directory exists while a path lies under it


class TestFabricCopy(abstract.AbstractCopyTests, FabricFixtures):
    pass


class TestFabricGet(abstract.AbstractGetTests, FabricFixtures):
    pass


class TestFabricPut(abstract.AbstractPutTests, FabricFixtures):
    pass


class TestFabricOpen(abstract.AbstractOpenTests, FabricFixtures):
    pass


class TestFabricPipe(abstract.AbstractPipeTests, FabricFixtures):
    pass


# -- reads -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def source(hub: Hub) -> tuple[str, dict[str, bytes]]:
    """A committed repository of files of several sizes and kinds of content."""
    repo = new_repo(hub, "src")
    files = {
        "empty": b"",
        "small.txt": b"hello, fabric\n",
        "text/log.txt": b"".join(b"line %d of a log that compresses well\n" % i for i in range(200_000)),
        "bin/random.bin": incompressible(6 * 1024 * 1024 + 12_345, 1),
        **{f"samples/{i:03d}.bin": incompressible(110 * 1024 + i, 100 + i) for i in range(24)},
    }
    plane = hub.plane()
    for path, data in files.items():
        plane.put_object(repo, "main", path, io.BytesIO(data))
    plane.commit(repo, "main", "source")
    return repo, files


def test_entry_point_urls_and_environment(hub: Hub, source, monkeypatch):
    repo, files = source
    assert fsspec.get_filesystem_class("fabric") is FabricFileSystem
    with fsspec.open(f"fabric://{repo}@main/small.txt", "rb", server=hub.url, token=hub.token) as f:
        assert f.read() == files["small.txt"]
    fs, path = fsspec.core.url_to_fs(f"fabric://{repo}@main/bin/random.bin", server=hub.url, token=hub.token)
    assert isinstance(fs, FabricFileSystem) and path == f"{repo}@main/bin/random.bin"
    monkeypatch.setenv("FABRIC_SERVER", hub.url)
    monkeypatch.setenv("FABRIC_TOKEN", hub.token)
    env_fs = fsspec.filesystem("fabric", skip_instance_cache=True)
    # REPO/path reads the default branch; REPO@REF/path any ref (a commit id too).
    head = hub.plane().resolve_commit(repo, "main")
    assert env_fs.cat(f"fabric://{repo}/small.txt") == env_fs.cat(f"{repo}@{head}/small.txt") == files["small.txt"]
    monkeypatch.delenv("FABRIC_SERVER")
    with pytest.raises(ValueError, match="FABRIC_SERVER"):
        fsspec.filesystem("fabric", skip_instance_cache=True)


def test_default_branch_of_repository(hub: Hub, admin_fs):
    repo = unique_name("dflt")
    hub.plane().create_repo(repo, default_branch="dev")
    admin_fs.pipe(f"{repo}/a.txt", b"on dev")
    assert admin_fs.cat(f"{repo}@dev/a.txt") == b"on dev"
    assert admin_fs.ls(repo, detail=False) == [f"{repo}/a.txt"]  # names keep the form asked about


def test_reads_equal_the_source(admin_fs, source):
    repo, files = source
    for path, data in files.items():
        url = f"fabric://{repo}@main/{path}"
        assert admin_fs.cat_file(url) == data, path
        with admin_fs.open(url, "rb") as f:
            assert f.read() == data, path
        assert admin_fs.size(url) == len(data)
    log = files["text/log.txt"]
    with admin_fs.open(f"{repo}@main/text/log.txt", "r") as f:  # text mode
        assert f.readline() == log.split(b"\n")[0].decode() + "\n"


def test_random_access_reads_whole_chunks_with_readahead(hub: Hub, admin_fs, source):
    repo, files = source
    data = files["bin/random.bin"]
    rng = random.Random(7)
    with admin_fs.open(f"{repo}@main/bin/random.bin", "rb", cache_type="none") as f:
        for _ in range(60):
            offset = rng.randrange(len(data) + 10)
            size = rng.choice([1, 17, 4096, 70_000, 300_000])
            f.seek(offset)
            assert f.read(size) == data[offset : offset + size]
        f.seek(-5, os.SEEK_END)
        assert f.read() == data[-5:]
    for start, end in [(0, 1), (65_000, 700_000), (-100, None), (None, 10), (len(data) - 1, len(data) + 50), (10, 5)]:
        assert admin_fs.cat_file(f"{repo}@main/bin/random.bin", start, end) == data[start:end]
    # Sequential small reads are served from readahead blocks: one frames request per block.
    block = 1024 * 1024
    before = frames_requests(hub.metrics())
    with admin_fs.open(f"{repo}@main/bin/random.bin", "rb", block_size=block) as f:
        got = b"".join(iter(lambda: f.read(64 * 1024), b""))
    assert got == data
    requests = frames_requests(hub.metrics()) - before
    assert requests <= len(data) // block + 2, requests  # ~100 reads of 64 KiB
    assert DEFAULT_BLOCK_SIZE >= block


def test_a_sequential_reader_makes_fewer_larger_requests_and_a_seek_fetches_only_its_range(hub: Hub, admin_fs, source):
    repo, files = source
    data = files["bin/random.bin"]
    block = 256 * 1024
    before = frames_requests(hub.metrics())
    with admin_fs.open(f"{repo}@main/bin/random.bin", "rb", block_size=block) as f:
        got = b"".join(iter(lambda: f.read(block), b""))
    assert got == data
    # fsspec asks for 24 ranges of 512 KiB (12 without its own cache's hits); each request
    # that misses also takes the chunks after its range, twice as many each time.
    requests = frames_requests(hub.metrics()) - before
    assert requests <= 5, requests
    # Reads after seeks fetch only the chunks they cover.
    with admin_fs.open(f"{repo}@main/bin/random.bin", "rb", cache_type="none") as f:
        for offset in (3 << 20, 1 << 20, 5 << 20):
            f.seek(offset)
            assert f.read(1000) == data[offset : offset + 1000]
        held = f._chunks.size
        assert held <= 3 * MAX_CHUNK
        # Reading on, a read that misses takes as many bytes again after its range.
        assert f.read(300_000) == data[(5 << 20) + 1000 : (5 << 20) + 301_000]
        assert f._chunks.size - held >= 600_000 - 2 * MAX_CHUNK


def test_cat_ranges_is_one_request_per_batch(hub: Hub, admin_fs, source):
    repo, files = source
    names = sorted(p for p in files if p.startswith("samples/"))
    paths = [f"fabric://{repo}@main/{p}" for p in names]
    starts = [i * 1000 for i in range(len(names))]
    ends = [s + 50_000 for s in starts]
    before = frames_requests(hub.metrics())
    got = admin_fs.cat_ranges(paths, starts, ends)
    assert frames_requests(hub.metrics()) - before == 1
    assert got == [files[p][s:e] for p, s, e in zip(names, starts, ends)]
    # cat of many files (a batch of samples) is one frames request too.
    before = frames_requests(hub.metrics())
    whole = admin_fs.cat(paths)
    assert frames_requests(hub.metrics()) - before == 1
    assert whole == {admin_fs._strip_protocol(u): files[p] for u, p in zip(paths, names)}
    # A missing path fails alone (on_error="return"), or the call (on_error="raise").
    mixed = admin_fs.cat_ranges([paths[0], f"{repo}@main/nope.bin"], 0, 10)
    assert mixed[0] == files[names[0]][:10] and isinstance(mixed[1], FileNotFoundError)
    with pytest.raises(FileNotFoundError):
        admin_fs.cat_ranges([paths[0], f"{repo}@main/nope.bin"], 0, 10, on_error="raise")


def entry_requests(metrics: str) -> float:
    return metric_value(metrics, "fabric_http_requests_total", method="GET", route="/api/v1/repos/{repo}/refs/{ref}/entry")


def test_files_read_at_a_commit_id_are_looked_up_once(hub: Hub, source):
    """A commit never changes: reading its files again (a dataset's next epoch) asks for no
    entry again; reading through a branch always asks (the branch may have moved)."""
    repo, files = source
    fs = new_fs(hub.url, hub.token)
    names = sorted(p for p in files if p.startswith("samples/"))
    pinned = fs.pin(f"fabric://{repo}@main")
    before = entry_requests(hub.metrics())
    for _ in range(3):
        assert fs.cat([f"{pinned}/{p}" for p in names]) == {fs._strip_protocol(f"{pinned}/{p}"): files[p] for p in names}
    assert entry_requests(hub.metrics()) - before == len(names)
    before = entry_requests(hub.metrics())
    for _ in range(2):
        fs.cat_file(f"{repo}@main/{names[0]}")
    assert entry_requests(hub.metrics()) - before == 2


def test_a_listing_at_a_commit_id_keeps_the_entries_of_small_files(hub: Hub, source):
    """find() at a commit id keeps the entries whose chunk lists came with the walk, so a
    loader that lists its files first reads the small ones without asking for an entry; a
    file whose chunk list is stored apart (over 64 chunks) is asked for once. A branch's
    listing keeps nothing (the branch may move)."""
    repo, files = source
    fs = new_fs(hub.url, hub.token)
    pinned = fs.pin(f"fabric://{repo}@main")
    names = fs.find(pinned)
    before = entry_requests(hub.metrics())
    got = fs.cat(names)
    assert {name.split("/", 1)[1]: data for name, data in got.items()} == files
    assert entry_requests(hub.metrics()) - before == 2  # bin/random.bin and text/log.txt
    other = new_fs(hub.url, hub.token)
    names = other.find(f"{repo}@main/samples")
    before = entry_requests(hub.metrics())
    other.cat(names)
    assert entry_requests(hub.metrics()) - before == len(names)


def test_listing_info_find_glob_du(hub: Hub, admin_fs, source):
    repo, files = source
    root = f"{repo}@main"
    listing = {d["name"]: d for d in admin_fs.ls(root)}
    assert set(listing) == {f"{root}/{n}" for n in ("empty", "small.txt", "text", "bin", "samples")}
    small = listing[f"{root}/small.txt"]
    assert small["type"] == "file" and small["size"] == len(files["small.txt"]) and small["mtime"] > 0
    assert small["etag"] == hashlib.md5(files["small.txt"]).hexdigest()
    assert listing[f"{root}/bin"]["type"] == "directory"
    assert admin_fs.info(f"{root}/bin") == {"name": f"{root}/bin", "size": 0, "type": "directory"}
    assert admin_fs.info(f"fabric://{root}/small.txt") == small
    assert admin_fs.ls(f"{root}/small.txt") == [small]  # ls of a file: the file
    assert admin_fs.find(root) == sorted(f"{root}/{p}" for p in files)
    assert admin_fs.find(root, maxdepth=1) == [f"{root}/empty", f"{root}/small.txt"]
    assert f"{root}/samples" in admin_fs.find(root, withdirs=True)
    assert admin_fs.glob(f"{root}/samples/00*.bin") == [f"{root}/samples/{i:03d}.bin" for i in range(10)]
    assert admin_fs.glob(f"{root}/**/*.txt") == [f"{root}/small.txt", f"{root}/text/log.txt"]
    assert admin_fs.du(root) == sum(len(d) for d in files.values())
    assert admin_fs.du(f"{root}/samples", total=False)[f"{root}/samples/003.bin"] == 110 * 1024 + 3
    assert admin_fs.exists(f"{root}/samples") and admin_fs.exists(f"{root}/empty") and not admin_fs.exists(f"{root}/sample")
    assert admin_fs.isdir(root) and admin_fs.isfile(f"{root}/empty") and not admin_fs.isdir(f"{root}/empty")
    assert repo in admin_fs.ls("", detail=False)


def test_a_directory_hides_a_file_of_its_name(hub: Hub, admin_fs):
    """Keys ``a`` and ``a/b`` may both exist (S3); like the mount, listings show the directory."""
    repo = new_repo(hub, "shadow")
    plane = hub.plane()
    plane.put_object(repo, "main", "a", io.BytesIO(b"file a"))
    plane.put_object(repo, "main", "a/b", io.BytesIO(b"file b"))
    assert admin_fs.ls(f"{repo}@main") == [{"name": f"{repo}@main/a", "size": 0, "type": "directory"}]
    assert admin_fs.isdir(f"{repo}@main/a")
    assert admin_fs.find(f"{repo}@main") == [f"{repo}@main/a/b"]


# -- writes ------------------------------------------------------------------------


def test_writes_are_staged_until_commit(hub: Hub, admin_fs):
    repo = new_repo(hub, "write")
    plane = hub.plane()
    data = incompressible(3 * 1024 * 1024 + 7, 3)
    with admin_fs.open(f"fabric://{repo}@main/ckpt/shard-0.bin", "wb", block_size=1024 * 1024) as f:
        for i in range(0, len(data), 100_000):
            f.write(data[i : i + 100_000])
    admin_fs.pipe(f"{repo}@main/ckpt/meta.json", b"{}")
    head = plane.resolve_commit(repo, "main")
    # Staged: the branch reads the files, its head does not have them yet.
    assert admin_fs.cat(f"{repo}@main/ckpt/shard-0.bin") == data
    assert not admin_fs.exists(f"{repo}@{head}/ckpt/meta.json")
    assert sorted(c.path for c in plane.uncommitted(repo, "main")) == ["ckpt/meta.json", "ckpt/shard-0.bin"]
    commit = admin_fs.commit(f"{repo}@main", "checkpoint 1")
    assert plane.resolve_commit(repo, "main") == commit and plane.log(repo, "main", limit=1)[0].message == "checkpoint 1"
    assert admin_fs.cat(f"{repo}@{commit}/ckpt/shard-0.bin") == data
    with pytest.raises(ValueError, match="nothing to commit"):
        admin_fs.commit(f"{repo}@main", "again")


def test_a_file_being_written_is_at_the_server_before_it_is_closed(hub: Hub, admin_fs):
    from fabric.format import chunking

    repo = new_repo(hub, "stream")
    plane = hub.plane()
    data = incompressible(24 * 1024 * 1024, 4)
    chunks = [(chunking.chunk_id(p), len(p)) for p in chunking.cut(data)]
    with admin_fs.open(f"{repo}@main/shard.bin", "wb", block_size=4 * 1024 * 1024) as f:
        for i in range(0, len(data), 1024 * 1024):
            f.write(data[i : i + 1024 * 1024])
        f._fed()  # (the block in flight)

        def held() -> int:
            missing = set(plane.missing_chunks([cid for cid, _ in chunks], repo=repo))
            return sum(n for cid, n in chunks if cid not in missing)

        # The sink uploads in the background: every full pack (16 MiB) arrives before close.
        deadline = time.monotonic() + 30
        while held() < 16 * 1024 * 1024:
            assert time.monotonic() < deadline, f"only {held()} bytes at the server before close"
            time.sleep(0.05)
        assert not list(plane.uncommitted(repo, "main"))  # staged only on close
    entry = plane.stat_chunks(repo, "main", "shard.bin")
    assert list(entry.chunks) == chunks and entry.md5 == hashlib.md5(data).hexdigest()
    assert admin_fs.cat(f"{repo}@main/shard.bin") == data


def test_commit_option_commits_after_each_write(hub: Hub):
    repo = new_repo(hub, "autoc")
    plane = hub.plane()
    fs = new_fs(hub.url, hub.token, commit="written by fsspec")
    commits = lambda: len(plane.log(repo, "main"))
    n = commits()
    fs.pipe(f"{repo}@main/a.txt", b"a")
    with fs.open(f"{repo}@main/b.txt", "wb") as f:
        f.write(b"b")
    assert commits() == n + 2 and not list(plane.uncommitted(repo, "main"))
    fs.mv(f"{repo}@main/a.txt", f"{repo}@main/c.txt")  # one change set, one commit
    assert commits() == n + 3 and fs.find(f"{repo}@main") == [f"{repo}@main/b.txt", f"{repo}@main/c.txt"]
    fs.rm([f"{repo}@main/b.txt", f"{repo}@main/c.txt"])
    assert commits() == n + 4 and fs.find(f"{repo}@main") == []
    assert plane.log(repo, "main", limit=1)[0].message == "written by fsspec"


def test_a_failed_write_stores_nothing(hub: Hub, admin_fs):
    repo = new_repo(hub, "fail")
    with pytest.raises(RuntimeError):
        with admin_fs.open(f"{repo}@main/partial.bin", "wb") as f:
            f.write(b"half a checkpoint")
            raise RuntimeError("the job died")
    assert not admin_fs.exists(f"{repo}@main/partial.bin")
    assert not list(hub.plane().uncommitted(repo, "main"))


def test_rm_mv_cp_and_directories(hub: Hub, admin_fs):
    repo = new_repo(hub, "rm")
    root = f"{repo}@main"
    for p in ("d/x", "d/sub/y", "d/sub/z", "keep"):
        admin_fs.pipe(f"{root}/{p}", p.encode())
    admin_fs.mkdir(f"{root}/new/dir")  # object store: nothing to do, nothing fails
    admin_fs.makedirs(f"{root}/d/sub", exist_ok=True)
    assert not admin_fs.exists(f"{root}/new")
    with pytest.raises(OSError):
        admin_fs.rmdir(f"{root}/d")
    with pytest.raises(IsADirectoryError):
        admin_fs.rm(f"{root}/d")
    with pytest.raises(FileNotFoundError):
        admin_fs.rm(f"{root}/nothing")
    admin_fs.cp(f"{root}/d/x", f"{root}/copy")
    admin_fs.mv(f"{root}/d/sub/y", f"{root}/moved")
    assert admin_fs.cat(f"{root}/copy") == b"d/x" and admin_fs.cat(f"{root}/moved") == b"d/sub/y"
    other = new_repo(hub, "rm-other")  # across repositories: chunks are shared, not resent
    admin_fs.cp(f"{root}/moved", f"{other}@main/from-{repo}")
    assert admin_fs.cat(f"{other}@main/from-{repo}") == b"d/sub/y"
    admin_fs.rm(f"{root}/d", recursive=True)
    assert admin_fs.find(root) == [f"{root}/copy", f"{root}/keep", f"{root}/moved"]
    admin_fs.rm(f"{root}/*o*")  # a glob removes what it matches
    assert admin_fs.find(root) == [f"{root}/keep"]


# -- errors ------------------------------------------------------------------------


def test_bad_input_gets_the_error_fsspec_users_expect(hub: Hub, admin_fs, source):
    repo, files = source
    missing_repo = unique_name("missing")
    for call in (
        lambda: admin_fs.ls(f"{missing_repo}@main"),
        lambda: admin_fs.open(f"{missing_repo}@main/x"),
        lambda: admin_fs.cat(f"{missing_repo}/x"),
        lambda: admin_fs.info(f"{missing_repo}@main"),
        lambda: admin_fs.info(f"{repo}@no-such-branch/small.txt"),
        lambda: admin_fs.open(f"{repo}@main/nope"),
        lambda: admin_fs.ls(f"{repo}@main/nope"),
    ):
        with pytest.raises(FileNotFoundError):
            call()
    with pytest.raises(IsADirectoryError):
        admin_fs.open(f"{repo}@main/samples")
    with pytest.raises(IsADirectoryError):
        admin_fs.cat_file(f"{repo}@main")
    with pytest.raises(NotADirectoryError):
        admin_fs.open(f"{repo}@main/small.txt/inner")
    with pytest.raises(NotADirectoryError):
        admin_fs.ls(f"{repo}@main/small.txt/inner")
    for bad in ("Bad_Repo@main/x", f"{repo}@main/a/../b", f"{repo}@/x", f"{repo}@main/a//b"):
        with pytest.raises(ValueError):
            admin_fs.cat(bad)
    with pytest.raises(ValueError, match="mode"):
        admin_fs.open(f"{repo}@main/small.txt", "ab")
    with pytest.raises(FileExistsError):
        admin_fs.open(f"{repo}@main/small.txt", "xb")
    with pytest.raises(IsADirectoryError):
        admin_fs.pipe(f"{repo}@main/samples", b"over a directory")


def test_tokens_without_access_get_permission_errors(hub: Hub, source):
    repo, files = source
    other = new_repo(hub, "private")
    reader = new_fs(hub.url, make_token(hub, unique_name("reader"), {repo: "read"}))
    assert reader.cat(f"{repo}@main/small.txt") == files["small.txt"]  # its repository's chunks
    assert reader.cat_ranges([f"{repo}@main/samples/000.bin"], [0], [10]) == [files["samples/000.bin"][:10]]
    for call in (
        lambda: reader.ls(f"{other}@main"),
        lambda: reader.open(f"{other}@main/x"),
        lambda: reader.info(f"{other}@main"),
        lambda: reader.pipe(f"{repo}@main/new.txt", b"no write role"),
        lambda: reader.rm(f"{repo}@main/small.txt"),
    ):
        with pytest.raises(PermissionError):
            call()
    assert not list(hub.plane().uncommitted(repo, "main"))  # nothing changed
    nobody = new_fs(hub.url, "not-a-token")
    with pytest.raises(PermissionError):
        nobody.cat(f"{repo}@main/small.txt")


def test_writing_to_a_tag_or_commit_is_refused(hub: Hub, admin_fs, source):
    repo, files = source
    plane = hub.plane()
    tag = unique_name("v")
    plane.create_tag(repo, tag, "main")
    head = plane.resolve_commit(repo, "main")
    with pytest.raises(PermissionError, match="is a tag, and tags are read-only"):
        admin_fs.open(f"{repo}@{tag}/new.txt", "wb")
    with pytest.raises(PermissionError, match="tag"):
        admin_fs.pipe(f"{repo}@{tag}/new.txt", b"x")
    with pytest.raises(PermissionError, match="is a commit"):
        admin_fs.rm(f"{repo}@{head}/small.txt")
    with pytest.raises(FileNotFoundError, match="no branch"):
        admin_fs.pipe(f"{repo}@nonesuch/new.txt", b"x")
    assert admin_fs.cat(f"{repo}@{tag}/small.txt") == files["small.txt"]  # a tag reads as before
    assert not list(plane.uncommitted(repo, "main"))


def test_file_system_pickles(hub: Hub, admin_fs, source):
    """DataLoader workers and dask get the file system by pickle."""
    import pickle

    repo, files = source
    clone = pickle.loads(pickle.dumps(admin_fs))
    assert clone.cat(f"{repo}@main/small.txt") == files["small.txt"]


# -- pandas and pyarrow ------------------------------------------------------------


def test_pandas_and_pyarrow_read_parquet(hub: Hub, admin_fs):
    try:
        import pandas as pd
        import pyarrow.dataset as ds
    except ImportError as exc:
        missing(f"pandas and pyarrow (the test extra: pip install -e '.[test]'): {exc}")
    repo = new_repo(hub, "pq")
    opts = {"server": hub.url, "token": hub.token}
    frames = [
        pd.DataFrame({"id": range(i * 1000, (i + 1) * 1000), "x": [random.Random(i).random() for _ in range(1000)], "part": i})
        for i in range(4)
    ]
    for i, df in enumerate(frames):
        df.to_parquet(f"fabric://{repo}@main/table/part-{i}.parquet", storage_options=opts, index=False)
    admin_fs.commit(f"{repo}@main", "table")
    whole = pd.concat(frames, ignore_index=True)
    got = pd.read_parquet(f"fabric://{repo}@main/table/part-2.parquet", storage_options=opts)
    pd.testing.assert_frame_equal(got, frames[2])
    dataset = ds.dataset(f"{repo}@main/table", filesystem=admin_fs, format="parquet")
    table = dataset.to_table().to_pandas().sort_values("id", ignore_index=True)
    pd.testing.assert_frame_equal(table, whole)
    assert dataset.count_rows(filter=ds.field("part") == 3) == 1000
    csv = whole.to_csv(index=False).encode()
    admin_fs.pipe(f"{repo}@main/table.csv", csv)
    pd.testing.assert_frame_equal(pd.read_csv(f"fabric://{repo}@main/table.csv", storage_options=opts), whole)


# -- through a spoke ---------------------------------------------------------------


def test_through_a_spoke(hub: Hub, source, tmp_path):
    repo, files = source
    with start_spoke(hub.url, tmp_path / "spoke-cache", "256MiB", token=hub.token) as spoke:
        fs = new_fs(spoke.url, hub.token)
        names = sorted(p for p in files if p.startswith("samples/"))
        assert fs.cat_ranges([f"{repo}@main/{p}" for p in names], 0, None) == [files[p] for p in names]
        data = files["bin/random.bin"]
        with fs.open(f"fabric://{repo}@main/bin/random.bin") as f:
            f.seek(4_000_000)
            assert f.read(500_000) == data[4_000_000:4_500_000]
        assert fs.find(f"{repo}@main/text") == [f"{repo}@main/text/log.txt"]
        written = unique_name("spoke-write")
        hub.plane().create_repo(written)
        fs.pipe(f"{written}@main/from-spoke.bin", data[:1_000_000])
        commit = fs.commit(f"{written}@main", "through a spoke")
        hub_fs = new_fs(hub.url, hub.token)
        assert hub_fs.cat(f"{written}@{commit}/from-spoke.bin") == data[:1_000_000]
