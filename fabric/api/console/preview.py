"""Previews of a file for the console: text, images, the first rows of CSV and parquet.

Every preview is data for a template, which escapes it: nothing read from a repository
is ever sent as markup. Images are shown through the download route, and only types
that cannot carry script (never SVG or HTML).
"""

from __future__ import annotations

import csv
import io
import posixpath

from fabric.format.model import Entry
from fabric.plane.reads import Reads

TEXT_BYTES = 64 * 1024
ROWS = 20
#: The largest image shown inline (larger ones: a download link only).
IMAGE_BYTES = 16 * 1024 * 1024
#: Content types served inline by the download route; everything else is an attachment.
IMAGE_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
    ".bmp": "image/bmp",
}
TEXT_EXTENSIONS = {
    ".txt", ".md", ".json", ".jsonl", ".ndjson", ".yaml", ".yml", ".toml", ".py", ".sh", ".log", ".ini", ".cfg",
    ".xml", ".html", ".htm", ".svg", ".js", ".css", ".rst", ".c", ".h", ".go", ".rs", ".java", ".sql", ".tsv",
}  # fmt: skip


def extension(path: str) -> str:
    return posixpath.splitext(path.lower())[1]


def image_type(path: str) -> str | None:
    return IMAGE_TYPES.get(extension(path))


class _PlaneFile(io.RawIOBase):
    """A file of a plane as a seekable binary file (ranged reads): what pyarrow needs."""

    def __init__(self, plane: Reads, repo: str, ref: str, path: str, size: int) -> None:
        self.plane, self.repo, self.ref, self.path, self.size = plane, repo, ref, path, size
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else self.pos + offset if whence == 1 else self.size + offset
        return self.pos

    def readinto(self, buf) -> int:  # noqa: ANN001 - a writable buffer
        n = min(len(buf), self.size - self.pos)
        if n <= 0:
            return 0
        data = self.plane.read(self.repo, self.ref, self.path, self.pos, n)
        buf[: len(data)] = data
        self.pos += len(data)
        return len(data)


def _table(header: list[str], rows: list[list[str]]) -> dict:
    return {"kind": "table", "header": header, "rows": rows}


def parquet_rows(plane: Reads, repo: str, ref: str, path: str, size: int) -> dict:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return {"kind": "none", "reason": "parquet preview needs pyarrow, which is not installed here"}
    try:
        f = pq.ParquetFile(io.BufferedReader(_PlaneFile(plane, repo, ref, path, size), 1024 * 1024))
        batch = next(f.iter_batches(batch_size=ROWS), None)
        header = [field.name for field in f.schema_arrow]
        rows = [] if batch is None else [[_cell(v) for v in row.values()] for row in batch.to_pylist()]
        out = _table(header, rows)
        out["total_rows"] = f.metadata.num_rows
        return out
    except Exception as exc:  # noqa: BLE001 - a broken file is shown as such, not as a server error
        return {"kind": "none", "reason": f"not a readable parquet file: {exc}"}


def _cell(v: object) -> str:
    s = str(v)
    return s if len(s) <= 200 else s[:200] + "…"


def csv_rows(data: bytes, delimiter: str) -> dict:
    text = data.decode("utf-8", "replace")
    lines = text.splitlines()[: ROWS + 1]
    rows = [[_cell(c) for c in r] for r in csv.reader(lines, delimiter=delimiter)]
    if not rows:
        return {"kind": "text", "text": "", "truncated": False}
    return _table(rows[0], rows[1:])


def looks_binary(data: bytes) -> bool:
    if b"\0" in data[:8192]:
        return True
    try:
        data[:8192].decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.start < len(data[:8192]) - 4  # a character cut at the end is still text
    return False


def preview(plane: Reads, repo: str, ref: str, path: str, entry: Entry) -> dict:
    """What the file page shows for ``path``: ``{"kind": "text"|"table"|"image"|"none", ...}``."""
    if entry.kind != "file":
        return {"kind": "none", "reason": f"a {entry.kind}" + (f" to {entry.target}" if entry.target else "")}
    ext = extension(path)
    if image_type(path):
        if entry.size > IMAGE_BYTES:
            return {"kind": "none", "reason": "image too large to show here"}
        return {"kind": "image"}
    if ext == ".parquet":
        return parquet_rows(plane, repo, ref, path, entry.size)
    if entry.size == 0:
        return {"kind": "text", "text": "", "truncated": False}
    data = plane.read(repo, ref, path, 0, min(entry.size, TEXT_BYTES))
    if ext in (".csv", ".tsv"):
        out = csv_rows(data, "\t" if ext == ".tsv" else ",")
        out["truncated"] = entry.size > len(data)
        return out
    if ext not in TEXT_EXTENSIONS and looks_binary(data):
        return {"kind": "none", "reason": "binary file"}
    return {"kind": "text", "text": data.decode("utf-8", "replace"), "truncated": entry.size > len(data)}
