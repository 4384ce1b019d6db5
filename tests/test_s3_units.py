"""Gateway pieces in-process: ranges, ETag matching, multipart state, autocommit, XML parsing."""

from __future__ import annotations

import io
import time

import pytest

from fabric.api.s3 import xml as X
from fabric.api.s3.autocommit import AutoCommitter
from fabric.api.s3.conditions import etag_matches as _etag_matches
from fabric.api.s3.errors import S3Error
from fabric.api.s3.multipart import Uploads
from fabric.api.s3.objects import requested_range as parse_range


def test_parse_range():
    assert parse_range("bytes=0-9", 100) == (0, 10)
    assert parse_range("bytes=90-", 100) == (90, 10)
    assert parse_range("bytes=-10", 100) == (90, 10)
    assert parse_range("bytes=-1000", 100) == (0, 100)
    assert parse_range("bytes=50-1000", 100) == (50, 50)
    for ignored in ("bytes=abc", "bytes=0-1,5-6", "items=0-1", "bytes=9-2", "bytes"):
        assert parse_range(ignored, 100) is None, ignored
    for bad in ("bytes=100-", "bytes=200-300"):
        with pytest.raises(S3Error) as e:
            parse_range(bad, 100)
        assert e.value.code == "InvalidRange" and e.value.headers["Content-Range"] == "bytes */100"


def test_etag_matching():
    assert _etag_matches('"abc"', "abc") and _etag_matches("abc", "abc") and _etag_matches("*", "x")
    assert _etag_matches('"x", W/"abc"', "abc") and not _etag_matches('"abd"', "abc")


def test_multipart_state_survives_reopen_and_lists_in_order(tmp_path):
    u = Uploads(str(tmp_path))
    ids = [u.create("b", k, "r", "main", k, {"m": "1"}, "me") for k in ("b/2", "a/1", "b/2")]
    u.put_part(ids[0], 2, "e2", 5, [(b"\1" * 32, 5)])
    u.put_part(ids[0], 1, "e1", 7, [(b"\2" * 32, 7)])
    u.put_part(ids[0], 1, "e1b", 8, [(b"\3" * 32, 8)])  # a part uploaded again replaces the first
    u.close()
    u = Uploads(str(tmp_path))
    assert [(p.number, p.etag, p.size) for p in u.parts(ids[0])] == [(1, "e1b", 8), (2, "e2", 5)]
    assert u.part_chunks(ids[0])[1][2] == [(b"\3" * 32, 8)]
    assert [x.key for x in u.list("b")] == ["a/1", "b/2", "b/2"]
    assert [x.key for x in u.list("b", prefix="b/")] == ["b/2", "b/2"]
    assert [x.key for x in u.list("b", key_marker="a/1")] == ["b/2", "b/2"]
    first_b = min(i for i in (ids[0], ids[2]))
    assert [x.id for x in u.list("b", key_marker="b/2", id_marker=first_b)] == [max(ids[0], ids[2])]
    assert u.get(ids[1]).meta == {"m": "1"}
    assert u.delete(ids[0]) and not u.delete(ids[0]) and u.get(ids[0]) is None


def test_autocommit_every_interval(sqlite_engine):
    e = sqlite_engine
    e.create_repo("auto")
    committer = AutoCommitter(e, 0.3)
    try:
        e.put_object("auto", "main", "a.txt", io.BytesIO(b"a"))
        committer.wrote("auto", "main", "tester")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(e.log("auto", "main")) < 2:
            time.sleep(0.05)
        log = e.log("auto", "main")
        assert log[0].message == "S3 writes" and log[0].author == "tester"
        assert list(e.uncommitted("auto", "main")) == []
        committer.wrote("auto", "main", "tester")  # nothing staged: no empty commit
        time.sleep(0.8)
        assert len(e.log("auto", "main")) == 2
    finally:
        committer.close()


def test_xml_documents():
    objects, quiet = X.parse_delete_objects(
        b'<Delete xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Quiet>true</Quiet>'
        b"<Object><Key>a&amp;b</Key></Object><Object><Key>c</Key><VersionId>1</VersionId></Object></Delete>"
    )
    assert objects == [("a&b", None), ("c", "1")] and quiet
    assert X.parse_complete(
        b"<CompleteMultipartUpload><Part><ETag>\"e1\"</ETag><PartNumber>1</PartNumber><ChecksumCRC32>x</ChecksumCRC32></Part>"
        b"</CompleteMultipartUpload>"
    ) == [(1, "e1")]
    assert X.parse_location(b"") is None
    assert X.parse_location(b"<CreateBucketConfiguration><LocationConstraint>eu-west-1</LocationConstraint></CreateBucketConfiguration>") == "eu-west-1"
    with pytest.raises(S3Error):
        X.parse_delete_objects(b"<Delete>" + b"<Object><Key>k</Key></Object>" * 1001 + b"</Delete>")
    assert "&#x1;" in X.esc("a\x01b") and X.key_text("a b/é", True) == "a%20b/%C3%A9"


def test_upload_maintenance_refreshes_part_chunks_and_expires_old_uploads(sqlite_engine, tmp_path):
    from fabric.api.s3 import S3Gateway

    e = sqlite_engine
    g = S3Gateway(e, None, state_dir=str(tmp_path / "s3"), upload_expiry=3600)
    try:
        sink = e.chunk_sink()
        from fabric.format.ingest import ingest_stream

        chunks, md5 = ingest_stream(io.BytesIO(b"part data" * 1000), sink)
        sink.close()
        live = g.uploads.create("b", "k", "r", "main", "k", {}, "me")
        g.uploads.put_part(live, 1, md5, 9000, chunks)
        seen: list = []
        real = e.missing_chunks
        e.missing_chunks = lambda ids: seen.extend(ids) or real(ids)  # type: ignore[method-assign]
        assert g.maintain_uploads() == {"touched_chunks": len(chunks), "aborted_uploads": 0}
        assert seen == [c for c, _ in chunks]
        assert g.maintain_uploads(now=time.time() + 7200)["aborted_uploads"] == 1
        assert g.uploads.get(live) is None
    finally:
        g.close()
