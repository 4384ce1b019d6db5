"""The engine on an S3 object store (a real moto S3 server over HTTP).

Everything that works on the local store works here too: import/export
round trip, commit/diff/merge, fsck (including detecting a damaged object)
and gc (which must delete from the bucket exactly what nothing reaches).
"""

from __future__ import annotations

import io
import os
import random
import uuid

import boto3
import pytest

from fabric.client.transfer import export_tree, import_directory
from fabric.engine.engine import Engine
from fabric.engine.maintenance import Walker, fsck, gc
from fabric.errors import Corruption
from tests.helpers.fstree import assert_same_tree, random_files, snapshot, write_file

MiB = 1 << 20
PREFIX = "hub/data"


@pytest.fixture
def s3(s3_endpoint: str):
    bucket = f"fabric-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=bucket)
    return client, bucket, f"s3://{bucket}/{PREFIX}?endpoint_url={s3_endpoint}"


@pytest.fixture
def s3_engine(tmp_path, s3):
    _, _, url = s3
    e = Engine.open(str(tmp_path / "hub"), store_url=url, gc_grace=3600)
    yield e
    e.close()


def bucket_keys(client, bucket: str) -> set[str]:
    keys = set()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys.update(o["Key"] for o in page.get("Contents", []))
    return keys


def make_tree(root: str) -> None:
    random_files(root, 120, seed=1, sizes=(0, 50_000), fanout=7, compressible=0.3)
    write_file(f"{root}/big/random.bin", random.Random(2).randbytes(6 * MiB), 0o600, 1_650_000_000_123_456_789)
    write_file(f"{root}/unicode/caf\u00e9 \u4e2d\u6587 \U0001f600.txt", b"unicode\n", 0o644, 1_650_000_000_000_000_001)
    write_file(f"{root}/empty-file", b"")
    os.symlink("big/random.bin", f"{root}/link")
    os.makedirs(f"{root}/empty-dir")


def test_round_trip_on_s3(s3_engine: Engine, s3, tmp_path) -> None:
    client, bucket, _ = s3
    src, out = str(tmp_path / "src"), str(tmp_path / "out")
    make_tree(src)
    s3_engine.create_repo("demo")
    r = import_directory(s3_engine, src, "demo", "main", "v1")
    assert r.commit is not None and r.new_bytes > 6 * MiB
    export_tree(s3_engine, "demo", "main", out)
    assert_same_tree(snapshot(src), snapshot(out))
    # Everything went to the bucket, under the prefix; nothing to a local store directory.
    keys = bucket_keys(client, bucket)
    assert any(k.startswith(f"{PREFIX}/packs/") for k in keys)
    assert any(k.startswith(f"{PREFIX}/objects/") for k in keys)
    assert all(k.startswith(f"{PREFIX}/") for k in keys)
    assert not os.path.exists(tmp_path / "hub" / "store")
    # Unchanged re-import: no commit. A fresh engine remembers the store URL.
    assert import_directory(s3_engine, src, "demo", "main", "again").commit is None
    again = Engine.open(str(tmp_path / "hub"))
    try:
        out2 = str(tmp_path / "out2")
        export_tree(again, "demo", "main", out2)
        assert_same_tree(snapshot(src), snapshot(out2))
        assert again.read("demo", "main", "big/random.bin", 3 * MiB, 100) == random.Random(2).randbytes(6 * MiB)[3 * MiB : 3 * MiB + 100]
    finally:
        again.close()


def test_commit_diff_merge_on_s3(s3_engine: Engine) -> None:
    e = s3_engine
    e.create_repo("demo")
    e.put_object("demo", "main", "a.txt", io.BytesIO(b"a v1"))
    e.put_object("demo", "main", "b.txt", io.BytesIO(b"b v1"))
    base = e.commit("demo", "main", "base")
    e.create_branch("demo", "exp", "main")
    e.put_object("demo", "exp", "a.txt", io.BytesIO(b"a from exp"))
    e.put_object("demo", "exp", "new.bin", io.BytesIO(random.Random(3).randbytes(MiB)))
    e.commit("demo", "exp", "exp work")
    e.delete_object("demo", "main", "b.txt")
    e.commit("demo", "main", "main work", expected_head=base.id)
    assert {(c.path, c.kind) for c in e.diff("demo", "main", "exp")} == {
        ("a.txt", "changed"), ("new.bin", "added"), ("b.txt", "added")
    }
    m = e.merge("demo", "exp", "main")
    assert set(m.parents) == {e.head("demo", "exp"), e.get_commit("demo", m.id).parents[0]}
    assert e.read("demo", "main", "a.txt") == b"a from exp"
    assert e.read("demo", "main", "new.bin") == random.Random(3).randbytes(MiB)
    assert {p for p, _ in e.walk("demo", "main")} == {"a.txt", "new.bin"}
    assert fsck(e).ok


def test_fsck_and_gc_on_s3(s3_engine: Engine, s3, tmp_path) -> None:
    client, bucket, _ = s3
    e = s3_engine
    e.create_repo("demo")
    keep = {"keep.bin": random.Random(4).randbytes(2 * MiB), "keep.txt": b"keep\n" * 1000}
    for p, d in keep.items():
        e.put_object("demo", "main", p, io.BytesIO(d))
    e.commit("demo", "main", "keep")
    e.create_branch("demo", "junk", "main")
    e.put_object("demo", "junk", "junk.bin", io.BytesIO(random.Random(5).randbytes(3 * MiB)))
    e.commit("demo", "junk", "junk")
    report = fsck(e)
    assert report.ok, report.problems
    before = bucket_keys(client, bucket)
    # Grace: nothing young goes.
    e.delete_branch("demo", "junk")
    assert gc(e, grace=3600).chunks_deleted == 0
    assert bucket_keys(client, bucket) == before
    r = gc(e, grace=0)
    assert r.chunks_deleted > 0 and r.packs_deleted >= 1 and r.objects_deleted > 0
    after = bucket_keys(client, bucket)
    assert after < before
    # What is left in the bucket is exactly what is reachable.
    found = Walker(e, verify=False).walk_all()
    objects = {k.rsplit("/", 1)[-1] for k in after if k.startswith(f"{PREFIX}/objects/")}
    packs = {k.rsplit("/", 1)[-1] for k in after if k.startswith(f"{PREFIX}/packs/")}
    assert objects == found.objects
    assert packs == {row[0] for row in e.catalog.packs()}
    assert {cid for cid, *_ in e.catalog.iter_chunk_ids()} == found.chunks
    assert fsck(e).ok
    for p, d in keep.items():
        assert e.read("demo", "main", p) == d

    # A damaged pack in the bucket is found by fsck and never served.
    cid = e.stat_chunks("demo", "main", "keep.bin").chunks[5][0]
    loc = e.catalog.locate(cid)
    key = next(k for k in after if k.endswith(loc.pack))
    blob = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    blob[loc.offset + loc.length // 2] ^= 0x01
    client.put_object(Bucket=bucket, Key=key, Body=bytes(blob))
    fresh = Engine.open(str(tmp_path / "hub"))  # no chunk cache
    try:
        report = fsck(fresh)
        assert not report.ok and len(report.problems) == 1 and cid.hex() in report.problems[0]
        with pytest.raises(Corruption):
            fresh.read("demo", "main", "keep.bin")
        assert fresh.read("demo", "main", "keep.txt") == keep["keep.txt"]
    finally:
        fresh.close()


def test_cli_with_s3_store(s3, cli, tmp_path) -> None:
    _, _, url = s3
    src = tmp_path / "src"
    random_files(str(src), 30, seed=6, sizes=(0, 100_000))
    cli("--store", url, "repo", "create", "demo")
    cli("import", str(src), "demo@main", "-m", "v1")  # the store URL is remembered
    assert cli("--json", "fsck").json()["ok"]
    cli("export", "demo@main", str(tmp_path / "out"))
    assert_same_tree(snapshot(str(src)), snapshot(str(tmp_path / "out")))
    assert not os.path.exists(os.path.join(cli.data, "store"))
