"""Encodings of engine values on the wire (JSON for people, msgpack for bulk)."""

from __future__ import annotations

from typing import Any

import msgpack

from fabric.errors import BadRequest
from fabric.format.model import Commit, Entry

MSGPACK = "application/msgpack"
#: Response header of a stage: the branch's staging seq that holds the entries.
STAGING_SEQ_HEADER = "X-Fabric-Staging-Seq"
#: On a stage that replays a write which may have landed: ``SEQ HEAD``, the branch's staging
#: seq and head when it was first tried; paths written since are left out.
STAGE_SINCE_HEADER = "X-Fabric-Stage-Since"


def entry_json(path: str, entry: Entry) -> dict[str, Any]:
    return {"path": path, **entry.describe()}


def entry_from_json(d: dict[str, Any]) -> Entry:
    """An entry from its JSON description (no chunk list: enough for stat and listings)."""
    return Entry(
        kind=d["type"],
        size=d["size"],
        mode=int(d["mode"], 8),
        mtime_ns=_ns(d, "mtime"),
        uid=d.get("uid"),
        gid=d.get("gid"),
        md5=d.get("etag", ""),
        # A JSON field may be present as null (REST sends every field of its model).
        target=d.get("target") or "",
        meta=d.get("metadata") or {},
        rdev=d.get("rdev") or 0,
        link=d.get("link") or "",
        ctime_ns=_ns(d, "ctime") if d.get("ctime") is not None else None,
    )


def _ns(d: dict[str, Any], field: str) -> int:
    """A time of a JSON description in nanoseconds: exact from ``FIELD_ns`` where the server
    sends it, else from the seconds of ``FIELD``."""
    exact = d.get(field + "_ns")
    return exact if isinstance(exact, int) else int(round(d[field] * 1e9))


def commit_from_json(d: dict[str, Any]) -> Commit:
    return Commit(d["tree"], tuple(d["parents"]), d["author"], d["message"], d["time"], d.get("meta", {}), d["id"])


def pack_changes(changes: dict[str, Entry | None], **fields: Any) -> bytes:
    body = {"changes": {p: (e.to_wire() if e is not None else None) for p, e in changes.items()}, **fields}
    return msgpack.packb(body, use_bin_type=True)


def unpack_changes(data: bytes) -> tuple[dict[str, Entry | None], dict[str, Any]]:
    """Decode a msgpack body ``{changes: {path: entry|None}, ...}``; BadRequest if malformed.

    Decoded entry by entry (not in one C call), so a large body run in a worker thread
    lets the event loop's thread take the interpreter between entries."""
    try:
        unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(data), 1))
        unpacker.feed(data)
        body: dict[str, Any] = {}
        changes: dict[str, Entry | None] | None = None
        for _ in range(unpacker.read_map_header()):
            key = unpacker.unpack()
            if key != "changes":
                body[key] = unpacker.unpack()
                continue
            changes = {}
            for _ in range(unpacker.read_map_header()):
                path, wire = unpacker.unpack(), unpacker.unpack()
                changes[str(path)] = Entry.from_wire(wire) if wire is not None else None
        if changes is None:
            raise KeyError("changes")
        if unpacker.tell() != len(data):
            raise ValueError(f"{len(data) - unpacker.tell()} bytes after the document")
    except Exception as exc:  # noqa: BLE001 - any decoding failure is the client's
        raise BadRequest(f"malformed msgpack body: expected {{changes: {{path: entry|null}}, ...}} ({exc})") from exc
    return changes, body


def hex_ids(ids: list[str], limit: int = 100_000) -> list[bytes]:
    if len(ids) > limit:
        raise BadRequest(f"too many chunk ids in one request ({len(ids)} > {limit}); split the batch")
    try:
        out = [bytes.fromhex(i) for i in ids]
    except ValueError as exc:
        raise BadRequest(f"chunk ids must be hex strings: {exc}") from exc
    if any(len(i) != 32 for i in out):
        raise BadRequest("chunk ids are 32 bytes (64 hex characters)")
    return out
