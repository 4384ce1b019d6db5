"""The samples of one shard: a tar file's members grouped by key (as webdataset does), or
a parquet file's rows."""

from __future__ import annotations

import posixpath
import tarfile
from collections.abc import Iterator
from typing import IO, Any

#: Rows a parquet shard is read in at a time.
PARQUET_BATCH_ROWS = 1024


def split_name(name: str) -> tuple[str, str] | None:
    """``(key, ext)`` of a tar member: the key is its path up to the first dot of its base
    name, the extension the rest (``a/b.seg.png`` → ``("a/b", "seg.png")``); None without a dot."""
    directory, base = posixpath.split(name)
    stem, dot, ext = base.partition(".")
    if not dot or not stem:
        return None
    return posixpath.join(directory, stem), ext


def tar_samples(stream: IO[bytes], url: str) -> Iterator[dict[str, Any]]:
    """The samples of a tar stream (read once, front to back; compressed tars too): each
    run of consecutive files with one key is ``{"__key__": key, "__url__": url, ext: bytes}``.
    Members that are not files or have no extension are skipped; ValueError for a file
    extension seen twice in one sample."""
    sample: dict[str, Any] | None = None
    with tarfile.open(fileobj=stream, mode="r|*") as tar:
        for member in tar:
            parts = split_name(member.name) if member.isfile() else None
            if parts is None:
                continue
            key, ext = parts
            if sample is not None and sample["__key__"] != key:
                yield sample
                sample = None
            if sample is None:
                sample = {"__key__": key, "__url__": url}
            if ext in sample:
                raise ValueError(f"{url}: {member.name}: a second {ext!r} file for sample {key!r}")
            data = tar.extractfile(member)
            sample[ext] = data.read() if data is not None else b""
    if sample is not None:
        yield sample


def parquet_rows(stream: IO[bytes]) -> Iterator[dict[str, Any]]:
    """The rows of a parquet file (seekable), each a dict of column name to value."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("reading parquet shards needs pyarrow: pip install pyarrow") from None
    for batch in pq.ParquetFile(stream).iter_batches(batch_size=PARQUET_BATCH_ROWS):
        yield from batch.to_pylist()
