"""What this hub process knows of its spokes, for the console's spokes page.

A spoke follows the hub through the watch stream (``hub/watch.py``): each open stream is
recorded here with its caller's token, its address, the last event seq it was sent and
when it last got a line (event or heartbeat, every few seconds). A spoke's lag is the
hub's latest event seq minus the seq its stream has reached. Streams that ended are kept
for :data:`KEEP_GONE_SECONDS` (at most :data:`MAX_STREAMS` records), in memory: each hub
process knows the streams it serves. Group membership comes from the catalog
(``hub/groups.py``), so every process shows every group.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass

from fabric.catalog import Catalog

KEEP_GONE_SECONDS = 600.0
MAX_STREAMS = 256


@dataclass
class StreamRecord:
    token_id: str | None
    token_name: str
    address: str
    spoke: str | None  # what the watcher calls itself (X-Fabric-Spoke), if anything
    opened: float
    seq: int = 0
    last_contact: float = 0.0
    closed: float | None = None

    def sent(self, seq: int) -> None:
        self.seq = max(self.seq, seq)
        self.last_contact = time.time()


class SpokeRegistry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._streams: dict[int, StreamRecord] = {}

    def opened(self, token_id: str | None, token_name: str, address: str, spoke: str | None, seq: int) -> StreamRecord:
        now = time.time()
        record = StreamRecord(token_id, token_name, address, spoke, now, seq, now)
        with self._lock:
            self._streams[next(self._ids)] = record
            self._trim(now)
        return record

    def closed(self, record: StreamRecord) -> None:
        record.closed = time.time()

    def _trim(self, now: float) -> None:
        for key in [k for k, r in self._streams.items() if r.closed is not None and now - r.closed > KEEP_GONE_SECONDS]:
            del self._streams[key]
        while len(self._streams) > MAX_STREAMS:
            gone = [k for k, r in self._streams.items() if r.closed is not None]
            del self._streams[(gone or list(self._streams))[0]]

    def streams(self) -> list[StreamRecord]:
        with self._lock:
            self._trim(time.time())
            return list(self._streams.values())

    def describe(self, catalog: Catalog, token_names: dict[str, str], ttl: float) -> dict:
        """The spokes page's data: streams (live first) with their lag, and live group members."""
        last = catalog.last_event_seq()
        now = time.time()
        rows = catalog.db.query("SELECT group_name, url, token_id, seen FROM group_members WHERE seen >= ? ORDER BY group_name, url",
                                (now - ttl,))  # fmt: skip
        groups = [{"group": g, "url": u, "token_id": t, "token_name": token_names.get(t or ""), "seen": s} for g, u, t, s in rows]
        streams = []
        for r in sorted(self.streams(), key=lambda r: (r.closed is not None, -r.opened)):
            streams.append({
                "token_name": r.token_name,
                "address": r.address,
                "spoke": r.spoke,
                "live": r.closed is None,
                "seq": r.seq,
                "lag": max(last - r.seq, 0),
                "opened": r.opened,
                "last_contact": r.last_contact,
                "groups": sorted({g["group"] for g in groups if g["token_id"] and g["token_id"] == r.token_id}),
            })  # fmt: skip
        return {"last_seq": last, "streams": streams, "groups": groups}
