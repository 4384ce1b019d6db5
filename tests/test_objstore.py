"""Contract tests of the object-store layer, run against every backend.

The S3 backend runs against a real moto S3 server in a subprocess, so the
requests, ranges, multipart uploads and error codes are genuine HTTP.
"""

from __future__ import annotations

import errno
import hashlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import fsspec
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from fabric.errors import (
    BadRequest,
    Conflict,
    NotFound,
    ObjectNotFound,
    Unavailable,
)
from fabric.store import (
    CountingStore,
    FaultInjectingStore,
    FsspecStore,
    LocalStore,
    ObjectInfo,
    ObjectStore,
    RetryingStore,
    S3Store,
    StoreWrapper,
    is_transient,
    open_store,
    validate_key,
)
from tests.moto_server import start_moto

BUCKET = "fabric-objstore-test"
BACKENDS = ["local", "retrying-local", "s3", "fsspec-memory", "fsspec-file"]
LOCAL_BACKENDS = ["local", "retrying-local", "fsspec-file"]


@dataclass
class Backend:
    """A store under test, and every name its storage holds near it.

    ``raw()`` lists the test's whole storage area (the store lives in
    ``store/`` inside it), temporary files included, so tests can prove that
    nothing was written outside the store and no temporary file was left.
    """

    store: ObjectStore
    raw: Callable[[], set[str]]


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    with start_moto() as endpoint:
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
        yield endpoint


def _local_raw(tmp_path: Path, area: Path) -> Callable[[], set[str]]:
    def raw() -> set[str]:
        return {
            os.path.relpath(p, area)
            for p in tmp_path.rglob("*")
            if p.is_file() and "src" not in p.relative_to(tmp_path).parts[:1]
        }

    return raw


def make_backend(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Backend:
    area = tmp_path / "area"
    run = f"t-{uuid.uuid4().hex}"
    if kind in ("local", "retrying-local"):
        store: ObjectStore = LocalStore(area / "store")
        if kind == "retrying-local":
            store = RetryingStore(store, base_delay=0.001)
        return Backend(store, _local_raw(tmp_path, area))
    if kind == "fsspec-file":
        return Backend(FsspecStore(f"file://{area}/store"), _local_raw(tmp_path, area))
    if kind == "fsspec-memory":
        fs = fsspec.filesystem("memory")
        request.addfinalizer(lambda: fs.exists(f"/{run}") and fs.rm(f"/{run}", recursive=True))
        skip = len(f"/{run}/")
        return Backend(
            FsspecStore(f"memory://{run}/store"), lambda: {p[skip:] for p in fs.find(f"/{run}")}
        )
    assert kind == "s3"
    endpoint = request.getfixturevalue("moto_endpoint")
    client = boto3.client("s3", endpoint_url=endpoint)

    def raw() -> set[str]:
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=run)
        return {o["Key"][len(run) + 1 :] for page in pages for o in page.get("Contents", ())}

    return Backend(S3Store(BUCKET, f"{run}/store", endpoint_url=endpoint), raw)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request.param, tmp_path, request)


@pytest.fixture(params=LOCAL_BACKENDS)
def local_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request.param, tmp_path, request)


@pytest.fixture
def store(backend: Backend) -> ObjectStore:
    return backend.store


def keys(infos: Iterator[ObjectInfo]) -> list[str]:
    return [info.key for info in infos]


# -- the contract, on every backend ----------------------------------------


def test_put_get_roundtrip(backend: Backend) -> None:
    store = backend.store
    store.put("packs/ab/abcdef", b"hello world")
    store.put("mv", memoryview(bytearray(b"0123456789"))[2:6])
    store.put("empty", b"")
    store.put("dir/ü ber+x=y.bin", b"\x00\xff" * 100)
    assert store.get("packs/ab/abcdef") == b"hello world"
    assert store.get("mv") == b"2345"
    assert store.get("empty") == b""
    assert store.get("dir/ü ber+x=y.bin") == b"\x00\xff" * 100
    assert backend.raw() == {
        "store/packs/ab/abcdef",
        "store/mv",
        "store/empty",
        "store/dir/ü ber+x=y.bin",
    }


def test_ranged_get_matches_slicing(store: ObjectStore) -> None:
    data = os.urandom(1000)
    store.put("obj", data)
    cases = [(0, None), (0, 1000), (0, 10), (10, 20), (990, 10), (990, 100), (999, None),
             (1000, None), (1000, 5), (5000, 5), (5000, None), (7, 0), (1000, 0)]  # fmt: skip
    for offset, length in cases:
        end = None if length is None else offset + length
        assert store.get("obj", offset, length) == data[offset:end], (offset, length)


def test_ranged_get_of_empty_object(store: ObjectStore) -> None:
    store.put("empty", b"")
    assert store.get("empty", 0, 10) == b""
    assert store.get("empty", 5) == b""


def test_get_ranges(store: ObjectStore) -> None:
    data = os.urandom(5000)
    store.put("obj", data)
    ranges = [(0, 100), (4900, 200), (100, 0), (6000, 10), (1234, 999)]
    assert store.get_ranges("obj", ranges) == [data[o : o + n] for o, n in ranges]
    assert store.get_ranges("obj", []) == []
    with pytest.raises(ObjectNotFound):
        store.get_ranges("missing", [(0, 1)])


def test_negative_range_is_refused(store: ObjectStore) -> None:
    store.put("obj", b"abc")
    for offset, length in [(-1, None), (0, -1), (-5, 2)]:
        with pytest.raises(BadRequest):
            store.get("obj", offset, length)
    with pytest.raises(BadRequest):
        store.get_ranges("obj", [(0, 1), (-1, 1)])


def test_overwrite_replaces_whole_object(backend: Backend) -> None:
    store = backend.store
    store.put("k", b"a" * 1000)
    store.put("k", b"bb")
    assert store.get("k") == b"bb"
    assert store.stat("k").size == 2
    assert backend.raw() == {"store/k"}  # no temporary file left behind


def test_stat_and_exists(store: ObjectStore) -> None:
    before = time.time()
    store.put("a/b", b"12345")
    info = store.stat("a/b")
    assert info.key == "a/b"
    assert info.size == 5
    assert before - 5 <= info.mtime <= time.time() + 5
    assert store.exists("a/b")
    assert not store.exists("a/c")
    assert not store.exists("a")  # a "directory" of keys is not an object


def test_missing_key_errors(store: ObjectStore) -> None:
    with pytest.raises(ObjectNotFound) as excinfo:
        store.get("no/such/key")
    assert "no/such/key" in str(excinfo.value)
    assert isinstance(excinfo.value, NotFound) and excinfo.value.status == 404
    with pytest.raises(ObjectNotFound):
        store.get("no/such/key", 0, 0)
    with pytest.raises(ObjectNotFound):
        store.get("no/such/key", 5, 10)
    with pytest.raises(ObjectNotFound):
        store.stat("no/such/key")
    store.put("file", b"x")
    with pytest.raises(ObjectNotFound):
        store.get("file/under-an-object")


def test_delete_is_idempotent(backend: Backend) -> None:
    store = backend.store
    store.delete("never/existed")
    store.put("d/k", b"data")
    store.put("d/other", b"keep")
    store.delete("d/k")
    store.delete("d/k")
    with pytest.raises(ObjectNotFound):
        store.get("d/k")
    assert not store.exists("d/k")
    assert keys(store.list()) == ["d/other"]
    store.delete("d")  # a prefix, not an object: nothing to delete
    assert store.get("d/other") == b"keep"


LISTING_KEYS = ["b/x", "a-b", "a/b", "a/b2", "a/c/d", "ab", "a0", "z", "ü/1", "A", "a/c-", "a/c0"]


def test_list_sorted_with_prefix(store: ObjectStore) -> None:
    for i, key in enumerate(LISTING_KEYS):
        store.put(key, b"x" * i)
    listed = list(store.list())
    assert [i.key for i in listed] == sorted(LISTING_KEYS)
    assert {i.key: i.size for i in listed} == {k: n for n, k in enumerate(LISTING_KEYS)}
    assert all(isinstance(i, ObjectInfo) and i.mtime > 0 for i in listed)
    for prefix in ["", "a", "a/", "a/b", "a/c", "a/c/", "a/c/d", "b", "ü", "nope", "nope/", "a/x/"]:
        expected = sorted(k for k in LISTING_KEYS if k.startswith(prefix))
        assert keys(store.list(prefix)) == expected, prefix


def test_list_of_empty_store(store: ObjectStore) -> None:
    assert keys(store.list()) == []
    assert keys(store.list("a/b/")) == []


BAD_KEYS = ["", "/abs", "a//b", "a/", "/", "../x", "../../x", "a/../../x", "a/../b", "./a",
            "a/./b", ".", "..", "a\x00b", ".tmp-x", "d/.tmp-y", "x" * 1025, "\udcff"]  # fmt: skip


def test_invalid_keys_are_refused_and_nothing_written(backend: Backend, tmp_path: Path) -> None:
    store = backend.store
    src = tmp_path / "src" / "f"
    src.parent.mkdir()
    src.write_bytes(b"payload")
    calls: list[Callable[[str], object]] = [
        lambda key: store.put(key, b"payload"),
        lambda key: store.put_file(key, str(src)),
        store.get,
        lambda key: store.get_ranges(key, [(0, 1)]),
        store.stat,
        store.exists,
        store.delete,
    ]
    for key in BAD_KEYS:
        for call in calls:
            with pytest.raises(BadRequest):
                call(key)
    for prefix in ["/a", "../", "a//", "a/../", "x\x00"]:
        with pytest.raises(BadRequest):
            store.list(prefix)
    assert backend.raw() == set()


def test_put_file_large(backend: Backend, tmp_path: Path) -> None:
    store = backend.store
    src = tmp_path / "src" / "big.bin"
    src.parent.mkdir()
    data = os.urandom(20 * 1024 * 1024)
    src.write_bytes(data)
    store.put_file("big/file.bin", str(src))
    assert store.stat("big/file.bin").size == len(data)
    assert hashlib.sha256(store.get("big/file.bin")).digest() == hashlib.sha256(data).digest()
    boundary = 8 * 1024 * 1024  # boto3's multipart part size
    assert store.get("big/file.bin", boundary - 10, 20) == data[boundary - 10 : boundary + 10]
    assert store.get("big/file.bin", len(data) - 3) == data[-3:]
    store.put_file("big/file.bin", str(src))  # overwrite with put_file
    assert backend.raw() == {"store/big/file.bin"}


def test_put_file_missing_source_writes_nothing(backend: Backend, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        backend.store.put_file("k", str(tmp_path / "src" / "absent"))
    assert backend.raw() == set()


def test_url_and_describe(store: ObjectStore) -> None:
    assert isinstance(store.url, str) and store.url
    assert isinstance(store.describe(), str) and store.describe()
    assert store.describe() in repr(store)


def test_concurrent_puts_of_one_key_leave_one_whole_value(local_backend: Backend) -> None:
    store = local_backend.store
    size, writers, rounds = 256 * 1024, 8, 10
    values = [bytes([i]) * size for i in range(writers)]
    store.put("hot", values[0])
    errors: list[BaseException] = []
    done = threading.Event()

    def write(i: int) -> None:
        try:
            for _ in range(rounds):
                store.put("hot", values[i])
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    def read() -> None:
        try:
            while not done.is_set():
                value = store.get("hot")
                assert value in values, f"torn read: {len(value)} bytes, {set(value)}"
        except BaseException as exc:
            errors.append(exc)

    readers = [threading.Thread(target=read) for _ in range(2)]
    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for t in readers + threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    for t in readers:
        t.join()
    assert errors == []
    assert store.get("hot") in values
    assert local_backend.raw() == {"store/hot"}


# -- keys ------------------------------------------------------------------


def test_validate_key_accepts_ordinary_keys() -> None:
    for key in ["a", "a/b/c", "packs/ab/" + "f" * 64, "x.tmp-y", "a/.hidden", "ü/ß", "a b"]:
        assert validate_key(key) == key


# -- LocalStore specifics --------------------------------------------------


def test_local_failed_write_leaves_old_value_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(tmp_path / "s")
    store.put("d/k", b"old")

    def broken_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "disk on fire")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="disk on fire"):
        store.put("d/k", b"new")
    monkeypatch.undo()
    assert store.get("d/k") == b"old"
    assert sorted(os.listdir(tmp_path / "s" / "d")) == ["k"]


def test_local_list_skips_temp_files(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    store.put("d/k", b"x")
    (tmp_path / "s" / "d" / ".tmp-deadbeef").write_bytes(b"partial")
    (tmp_path / "s" / ".tmp-0011").write_bytes(b"partial")
    assert keys(store.list()) == ["d/k"]


def test_local_key_and_directory_conflict(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    store.put("a/b", b"inner")
    with pytest.raises(Conflict):
        store.put("a", b"outer")
    with pytest.raises(ObjectNotFound):
        store.get("a")
    with pytest.raises(ObjectNotFound):
        store.get("a", 0, 0)
    with pytest.raises(ObjectNotFound):
        store.stat("a")
    store.delete("a")
    store.put("f", b"file")
    with pytest.raises(Conflict):
        store.put("f/g", b"x")
    with pytest.raises(Conflict):
        store.put("f/g/h", b"x")
    assert [(i.key, store.get(i.key)) for i in store.list()] == [("a/b", b"inner"), ("f", b"file")]
    leftovers = [n for _, _, names in os.walk(tmp_path) for n in names if n.startswith(".tmp-")]
    assert leftovers == []


def test_local_huge_length_is_clamped(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    store.put("k", b"abc")
    assert store.get("k", 1, 10**15) == b"bc"
    assert store.get_ranges("k", [(0, 10**15), (2, 10**15)]) == [b"abc", b"c"]


def test_local_root_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(BadRequest):
        LocalStore(tmp_path / "f")


# -- S3 specifics ----------------------------------------------------------


def test_s3_put_file_to_missing_bucket_raises_client_error(
    moto_endpoint: str, tmp_path: Path
) -> None:
    src = tmp_path / "f"
    src.write_bytes(b"x" * 100)
    store = S3Store("no-such-bucket-here", endpoint_url=moto_endpoint)
    with pytest.raises(ClientError) as excinfo:
        store.put_file("k", str(src))
    assert excinfo.value.response["Error"]["Code"] == "NoSuchBucket"
    assert not is_transient(excinfo.value)


def test_s3_describe_hides_endpoint_credentials() -> None:
    store = S3Store("bkt", "p", endpoint_url="http://user:s3cr3t@127.0.0.1:9", region="eu-west-1")
    for text in (store.url, store.describe(), repr(store)):
        assert "s3cr3t" not in text and "user" not in text
        assert "127.0.0.1:9" in text
    reopened = open_store(store.url)
    assert isinstance(reopened, RetryingStore) and isinstance(reopened.inner, S3Store)
    assert reopened.inner.endpoint_url == "http://127.0.0.1:9"
    assert (reopened.inner.bucket, reopened.inner.prefix) == ("bkt", "p/")


def test_s3_invalid_bucket_or_prefix() -> None:
    for bucket in ["", "a", "bad bucket", "x/y", "-lead"]:
        with pytest.raises(BadRequest):
            S3Store(bucket, endpoint_url="http://127.0.0.1:9")
    with pytest.raises(BadRequest):
        S3Store("bkt", "a//b", endpoint_url="http://127.0.0.1:9")


# -- RetryingStore ---------------------------------------------------------


def retrying(inner: ObjectStore, sleeps: list[float], **kwargs: float) -> RetryingStore:
    return RetryingStore(inner, sleep=sleeps.append, **kwargs)  # type: ignore[arg-type]


def test_retry_recovers_from_transient_failures(tmp_path: Path) -> None:
    fault = FaultInjectingStore(LocalStore(tmp_path), fail_first=2, ops={"put"})
    counting = CountingStore(fault)
    sleeps: list[float] = []
    store = retrying(counting, sleeps)
    store.put("k", b"value")
    assert store.get("k") == b"value"
    assert fault.injected == 2
    assert counting.counters["put"] == {"calls": 3, "errors": 2, "bytes": 5}
    assert len(sleeps) == 2


def test_retry_gives_up_after_attempts_with_backoff(tmp_path: Path) -> None:
    LocalStore(tmp_path).put("k", b"v")
    fault = FaultInjectingStore(LocalStore(tmp_path), ops={"get"})
    counting = CountingStore(fault)
    sleeps: list[float] = []
    store = retrying(counting, sleeps, attempts=6, base_delay=0.1, max_delay=0.5)
    with pytest.raises(OSError) as excinfo:
        store.get("k")
    assert excinfo.value.errno == errno.EIO and "injected" in str(excinfo.value)
    assert counting.counters["get"]["calls"] == 6
    assert fault.injected == 6
    caps = [0.1, 0.2, 0.4, 0.5, 0.5]
    assert len(sleeps) == len(caps)
    for delay, cap in zip(sleeps, caps, strict=True):
        assert cap / 2 <= delay <= cap


def test_retry_never_retries_final_errors(tmp_path: Path) -> None:
    counting = CountingStore(LocalStore(tmp_path))
    sleeps: list[float] = []
    store = retrying(counting, sleeps)
    with pytest.raises(ObjectNotFound):
        store.get("missing")
    with pytest.raises(ObjectNotFound):
        store.stat("missing")
    with pytest.raises(BadRequest):
        store.put("../escape", b"x")
    with pytest.raises(FileNotFoundError):
        store.put_file("k", str(tmp_path / "absent"))
    counters = counting.counters
    assert counters["get"]["calls"] == counters["stat"]["calls"] == 1
    assert counters["put"]["calls"] == counters["put_file"]["calls"] == 1
    assert sleeps == []


def test_retry_real_sleep_is_bounded(tmp_path: Path) -> None:
    store = RetryingStore(
        FaultInjectingStore(LocalStore(tmp_path), fail_first=3), base_delay=0.01, max_delay=0.02
    )
    started = time.monotonic()
    store.put("k", b"v")
    assert time.monotonic() - started < 1.0
    assert store.get("k") == b"v"


class FlakyListing(StoreWrapper):
    """Lists ``fail_after`` items, then fails, ``failures`` times."""

    def __init__(self, inner: ObjectStore, fail_after: int, failures: int) -> None:
        super().__init__(inner)
        self.fail_after = fail_after
        self.failures = failures
        self.listings = 0

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self.listings += 1
        for n, info in enumerate(self.inner.list(prefix)):
            if n == self.fail_after and self.failures:
                self.failures -= 1
                raise ConnectionResetError("listing interrupted")
            yield info


def test_retry_resumes_interrupted_listing(tmp_path: Path) -> None:
    inner = LocalStore(tmp_path)
    names = [f"k{i:02d}" for i in range(20)]
    for name in names:
        inner.put(name, b"")
    flaky = FlakyListing(inner, fail_after=7, failures=2)
    sleeps: list[float] = []
    assert keys(retrying(flaky, sleeps).list()) == names
    assert flaky.listings == 3 and len(sleeps) == 2


def test_retry_listing_gives_up_without_progress(tmp_path: Path) -> None:
    inner = LocalStore(tmp_path)
    inner.put("a", b"")
    flaky = FlakyListing(inner, fail_after=0, failures=100)
    with pytest.raises(ConnectionResetError):
        list(retrying(flaky, [], attempts=3).list())
    assert flaky.listings == 3


def _client_error(code: str, status: int) -> ClientError:
    response = {
        "Error": {"Code": code, "Message": code},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return ClientError(response, "GetObject")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (OSError(errno.EIO, "io"), True),
        (ConnectionResetError(), True),
        (TimeoutError(), True),
        (PermissionError(), False),
        (FileNotFoundError(), False),
        (_client_error("SlowDown", 503), True),
        (_client_error("InternalError", 500), True),
        (_client_error("Throttling", 400), True),
        (_client_error("TooManyRequests", 429), True),
        (_client_error("NotImplemented", 501), False),
        (_client_error("NoSuchKey", 404), False),
        (_client_error("AccessDenied", 403), False),
        (EndpointConnectionError(endpoint_url="http://x"), True),
        (ObjectNotFound("x"), False),
        (BadRequest("x"), False),
        (Unavailable("x"), True),
        (ValueError("x"), False),
    ],
)
def test_is_transient(exc: BaseException, transient: bool) -> None:
    assert is_transient(exc) is transient


# -- FaultInjectingStore ---------------------------------------------------


def test_fault_before_writes_nothing_and_after_writes(tmp_path: Path) -> None:
    inner = LocalStore(tmp_path)
    with pytest.raises(OSError):
        FaultInjectingStore(inner).put("before", b"x")
    assert not inner.exists("before")
    with pytest.raises(OSError):
        FaultInjectingStore(inner, after=True).put("after", b"x")
    assert inner.get("after") == b"x"


def test_fault_every_nth_call_and_key_prefix(tmp_path: Path) -> None:
    store = FaultInjectingStore(LocalStore(tmp_path), fail_every=3, fail_keys_prefix="bad/")
    outcomes = []
    for i in range(7):
        for prefix in ("bad/", "good/"):
            try:
                store.put(f"{prefix}{i}", b"x")
                outcomes.append((prefix, "ok"))
            except OSError:
                outcomes.append((prefix, "fail"))
    assert [o for p, o in outcomes if p == "good/"] == ["ok"] * 7
    assert [o for p, o in outcomes if p == "bad/"] == ["ok", "ok", "fail", "ok", "ok", "fail", "ok"]
    assert store.injected == 2


def test_fault_custom_error(tmp_path: Path) -> None:
    store = FaultInjectingStore(
        LocalStore(tmp_path), error=lambda op, key: Unavailable(f"{op} {key}")
    )
    with pytest.raises(Unavailable, match="stat k"):
        store.stat("k")


# -- CountingStore ---------------------------------------------------------


def test_counting_store_counts_per_operation(tmp_path: Path) -> None:
    store = CountingStore(LocalStore(tmp_path / "s"))
    src = tmp_path / "f"
    src.write_bytes(b"y" * 7)
    store.put("a", b"abc")
    store.put("b", memoryview(b"defgh"))
    store.put_file("c", str(src))
    assert store.get("a") == b"abc"
    assert store.get("b", 1, 2) == b"ef"
    assert store.get_ranges("c", [(0, 2), (5, 10)]) == [b"yy", b"yy"]
    with pytest.raises(ObjectNotFound):
        store.get("missing")
    assert store.stat("a").size == 3
    assert store.exists("a") and not store.exists("zz")
    store.delete("a")
    assert keys(store.list()) == ["b", "c"]
    counters = store.counters
    assert counters["put"] == {"calls": 2, "errors": 0, "bytes": 8}
    assert counters["put_file"] == {"calls": 1, "errors": 0, "bytes": 7}
    assert counters["get"] == {"calls": 3, "errors": 1, "bytes": 5}
    assert counters["get_ranges"] == {"calls": 1, "errors": 0, "bytes": 4}
    assert counters["stat"]["calls"] == 1 and counters["exists"]["calls"] == 2
    assert counters["delete"]["calls"] == 1 and counters["list"]["calls"] == 1
    counters["put"]["calls"] = 999  # a snapshot, not the live counters
    assert store.counters["put"]["calls"] == 2


def test_counting_store_counts_listing_errors(tmp_path: Path) -> None:
    inner = LocalStore(tmp_path)
    inner.put("a", b"")
    inner.put("b", b"")
    store = CountingStore(FlakyListing(inner, fail_after=1, failures=1))
    with pytest.raises(ConnectionResetError):
        list(store.list())
    assert store.counters["list"] == {"calls": 1, "errors": 1, "bytes": 0}


def test_counting_store_is_thread_safe(tmp_path: Path) -> None:
    store = CountingStore(LocalStore(tmp_path))
    store.put("k", b"12345")
    threads = [
        threading.Thread(target=lambda: [store.get("k") for _ in range(200)]) for _ in range(16)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.counters["get"] == {"calls": 3200, "errors": 0, "bytes": 16000}


# -- open_store ------------------------------------------------------------


def test_open_store_local_path_and_file_url(tmp_path: Path) -> None:
    for url in [str(tmp_path / "a"), f"file://{tmp_path}/a", f"file://localhost{tmp_path}/a"]:
        store = open_store(url)
        assert isinstance(store, LocalStore) and store.root == str(tmp_path / "a")
    store = open_store(f"file://{tmp_path}/with%20space")
    assert isinstance(store, LocalStore) and store.root == str(tmp_path / "with space")
    store.put("k", b"v")
    assert open_store(store.url).get("k") == b"v"  # url round-trips


def test_open_store_s3(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FABRIC_S3_ENDPOINT", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    store = open_store(f"s3://{BUCKET}/open/store/?endpoint_url={moto_endpoint}&region=eu-west-1")
    assert isinstance(store, RetryingStore)
    inner = store.inner
    assert isinstance(inner, S3Store)
    assert (inner.bucket, inner.prefix, inner.endpoint_url, inner.region) == (
        BUCKET, "open/store/", moto_endpoint, "eu-west-1",
    )  # fmt: skip
    store.put("k", b"via open_store")
    reopened = open_store(store.url)
    assert reopened.get("k") == b"via open_store"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("FABRIC_S3_ENDPOINT", moto_endpoint)
    assert open_store(f"s3://{BUCKET}/open/store").get("k") == b"via open_store"
    monkeypatch.delenv("FABRIC_S3_ENDPOINT")
    assert open_store(f"s3://{BUCKET}").inner.endpoint_url == "http://127.0.0.1:1"  # type: ignore[attr-defined]


def test_open_store_fsspec() -> None:
    run = uuid.uuid4().hex
    store = open_store(f"memory://{run}/x")
    assert isinstance(store, RetryingStore) and isinstance(store.inner, FsspecStore)
    store.put("k", b"mem")
    assert open_store(f"memory://{run}/x").get("k") == b"mem"
    fsspec.filesystem("memory").rm(f"/{run}", recursive=True)


@pytest.mark.parametrize(
    "url",
    [
        "",
        "   ",
        "s3://",
        "s3:///prefix",
        "s3://bkt?bogus=1",
        "s3://bkt?region=a&region=b",
        "s3://AKIAKEY:s3cr3t@bkt/p",
        "s3://bkt/p?endpoint_url=ftp://host",
        "s3://bkt/p#frag",
        "s3://bkt/a//b",
        "s3://bkt/../b",
        "s3://bad bucket/x",
        "nosuchproto://x",
        "file://otherhost/x",
        "file:///x?y=1",
        "file://",
    ],
)
def test_open_store_refuses_bad_urls(url: str) -> None:
    with pytest.raises(BadRequest) as excinfo:
        open_store(url)
    assert "s3cr3t" not in str(excinfo.value)
