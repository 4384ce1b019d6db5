"""A ``--writeback`` mount at ``replicated`` durability: each file it parks at fsync is also
kept by a peer spoke (``spoke/mirrors.py``) before fsync returns.

Without it, write-back returns from fsync once the file is on this machine's disk alone,
whatever ``--durability`` says; the spoke gets it (at that durability) only when it is
staged, later. With it, fsync's promise is ``replicated``'s: this machine's disk and the disk
of a spoke of the group other than the one mounted, so losing this machine, and the spoke
beside it, loses no file fsync returned for. fsync then costs the local ``fdatasync`` plus
one copy of the file over the LAN (sent whole at each fsync that changed it: fit for
checkpoints, written once and synced once, not for a log fsynced after every line).

The peer is the one the mounted spoke names (the first member of its group in its own
rendezvous order). The mount renews a lease there every :data:`RENEW_EVERY` seconds; once
its files are staged it drops their copies, and at a clean unmount with nothing left parked
it ends the lease. A peer that has not heard from it for its ``--replica-takeover`` (30 s by
default) stages the files itself. When the peer cannot take a copy (down, full, refusing),
fsync stages the file inline at ``replicated`` instead, as without write-back: slower,
never weaker. While the peer does not answer, fsync does not try it (no connect timeout per
fsync), and the mount asks its spoke for a peer again every :data:`RENEW_EVERY` seconds,
taking another if it names one.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx

from fabric.client.http import Timeouts, raise_for_error
from fabric.client.transport import HttpClientTransport
from fabric.errors import BadRequest, Conflict, FabricError, Unavailable

log = logging.getLogger("fabric.fuse")

API = "/api/v1/mirror"
#: The durability at which a --writeback mount keeps its parked files at a peer too.
REPLICATED = "replicated"
#: Seconds between two renewals of the lease at the peer (its takeover is 30 s by default).
RENEW_EVERY = 2.0
#: Copies sent at once (each while its fsync's local fdatasync runs).
SENDERS = 8
#: Bytes read from the file per piece of a copy's body.
PIECE = 4 * 1024 * 1024
#: A copy crosses the LAN: fail over to staging inline if the peer stalls this long.
TIMEOUTS = Timeouts(connect=2.0, read=30.0, write=30.0, pool=5.0, slow=30.0)
#: The file in --write-dir naming this mount's copies at the peer (kept across restarts).
ID_FILE = "mirror-id"


class MirrorFailed(Exception):
    """The peer did not keep a copy (the caller stages the file instead)."""


class JournalMirror:
    """This mount's copies at one peer spoke."""

    def __init__(self, server: httpx.Client, peer: str, mount_id: str, timeouts: Timeouts = TIMEOUTS) -> None:
        """``server``: the mount's client of its server's REST API, which named ``peer`` and
        is asked again for another when that one stops answering (its token is good at the
        peers too)."""
        self._server = server
        self._headers: Mapping[str, str] = {k: v for k, v in server.headers.items() if k.lower() == "authorization"}
        self._timeouts = timeouts
        self.mount_id = mount_id
        self._connect(peer)
        #: The peer failed: no copy is tried (fsync stages inline at once) until it answers again.
        self._down = False
        self._senders = ThreadPoolExecutor(SENDERS, thread_name_prefix="fabric-mirror")
        self._drops: queue.Queue[str] = queue.Queue()
        self._stopped = threading.Event()
        self._renewer = threading.Thread(target=self._renew, name="fabric-mirror-lease", daemon=True)
        self.kept = 0  # copies the peer took
        self.kept_bytes = 0  # bytes sent for them
        self.appended = 0  # of them, copies sent as the bytes the file grew by
        self.failed = 0  # copies it did not take (staged inline instead)
        self.switched = 0  # times another peer was taken

    def _connect(self, peer: str) -> None:
        """Send copies to ``peer`` from now on (a copy under way to the one before fails)."""
        old = getattr(self, "_http", None)
        self.peer = peer.rstrip("/")
        self._http = httpx.Client(base_url=f"{self.peer}{API}/{self.mount_id}", headers=self._headers,
                                  timeout=self._timeouts.as_httpx(slow=True), transport=HttpClientTransport())
        if old is not None:
            old.close()

    @staticmethod
    def _ask_peer(server: httpx.Client) -> str:
        """The peer the mounted server names; BadRequest when it names none."""
        try:
            response = server.get("/mirror/peer")
        except httpx.HTTPError as exc:
            raise Unavailable(f"cannot ask {server.base_url} for a peer to keep this mount's files: {exc}") from None
        if response.status_code == 404:
            raise BadRequest("--writeback with --durability replicated needs a spoke in a group to mount "
                             "(a peer of it keeps a copy of each file before fsync returns); this server has no peers to offer")
        raise_for_error(response)
        return str(response.json()["peer"])

    @classmethod
    def open(cls, server: httpx.Client, write_dir: str) -> JournalMirror:
        """The mirror the server mounted names (``server``: the mount's client of its REST API,
        a spoke's), for the mount of ``write_dir``; BadRequest when it cannot name one."""
        mirror = cls(server, cls._ask_peer(server), _mount_id(write_dir))
        try:
            mirror.renew()  # (a token refused there is found now, not at the first fsync)
        except Unavailable as exc:  # the mount serves; fsync stages inline until a peer answers
            mirror._down = True
            log.warning("mirror: %s; fsync stages files inline while it does not", exc.message)
        mirror._renewer.start()
        return mirror

    # -- copies ------------------------------------------------------------------------
    def start_keep(self, rid: str, record: dict[str, Any], fd: int, size: int, offset: int = 0) -> Future[None]:
        """:meth:`keep` in the background (its result raises MirrorFailed)."""
        return self._senders.submit(self.keep, rid, record, fd, size, offset)

    def keep(self, rid: str, record: dict[str, Any], fd: int, size: int, offset: int = 0) -> None:
        """Have the peer keep file ``rid`` (``size`` bytes of ``fd``) on its disk; MirrorFailed if
        it did not. ``offset``: the length of the copy the peer keeps already, of which the file
        only grew: the bytes from there on are sent (the file whole, if the peer's copy is not
        that long: it restarted, or is another peer)."""
        if self._down:
            self.failed += 1
            raise MirrorFailed(f"the peer spoke {self.peer} is not answering")
        headers = {"X-Fabric-Record": _ascii_json(record), "Content-Length": str(size - offset), "Content-Type": "application/octet-stream"}
        try:
            params = {"offset": offset} if offset else None
            raise_for_error(self._http.put(f"/files/{rid}", params=params, content=_pieces(fd, size, offset), headers=headers))
        except (httpx.HTTPError, FabricError) as exc:
            if isinstance(exc, Conflict) and offset:  # the peer's copy is not the one this would grow
                self.keep(rid, record, fd, size)
                return
            self.failed += 1
            if not isinstance(exc, FabricError) or exc.status >= 500:
                self._down = True  # (a full peer, 413, still takes the next, smaller file)
            raise MirrorFailed(f"{self.peer} did not keep a copy: {getattr(exc, 'message', None) or exc}") from None
        self.kept += 1
        self.kept_bytes += size - offset
        self.appended += offset > 0

    def rename(self, rid: str, record: dict[str, Any]) -> None:
        """File ``rid`` now goes where ``record`` says (best effort: a miss leaves the peer
        the old name, which it stages only if this mount is lost)."""
        try:
            raise_for_error(self._http.put(f"/files/{rid}/record", content=_ascii_json(record),
                                           headers={"Content-Type": "application/json"}))
        except (httpx.HTTPError, FabricError) as exc:
            log.warning("mirror: %s did not take the new record of a parked file (%s)", self.peer, exc)

    def drop(self, rid: str) -> None:
        """Forget file ``rid``'s copy (in the background: staged, or replaced)."""
        self._drops.put(rid)

    # -- the lease --------------------------------------------------------------------
    def renew(self) -> None:
        """Renew the lease; Unavailable when the peer does not answer, the error it gave
        when it refuses (another token's copies, a token it does not know)."""
        try:
            response = self._http.post("/lease")
        except httpx.HTTPError as exc:
            raise Unavailable(f"the peer spoke {self.peer} that keeps this mount's parked files does not answer: {exc}") from None
        if response.status_code >= 500:
            raise Unavailable(f"the peer spoke {self.peer} that keeps this mount's parked files answers {response.status_code}")
        if response.status_code != 404:  # (no copies kept yet)
            raise_for_error(response)

    def _renew(self) -> None:
        while not self._stopped.wait(RENEW_EVERY):
            self._send_drops()
            try:
                self.renew()
                self._down = False
            except FabricError as exc:
                self._down = True
                log.warning("mirror: %s (fsync stages files inline while no peer takes copies)", exc.message)
                self._find_another()

    def _find_another(self) -> None:
        """Ask the mounted server for a peer again; take it if it names another. The copies at
        the one before are its to stage if this mount is lost; the files they are copies of are
        on this machine's disk alone until staged."""
        try:
            peer = self._ask_peer(self._server).rstrip("/")
        except (httpx.HTTPError, FabricError):
            return
        if peer == self.peer:
            return
        log.warning("mirror: copies go to %s from now on, instead of %s", peer, self.peer)
        while not self._drops.empty():  # (the copies there are not this peer's to drop)
            self._drops.get_nowait()
        self._connect(peer)
        self.switched += 1
        try:
            self.renew()
            self._down = False
        except FabricError:
            pass

    def _send_drops(self) -> None:
        while True:
            try:
                rid = self._drops.get_nowait()
            except queue.Empty:
                return
            try:
                response = self._http.delete(f"/files/{rid}")
                if response.status_code != 404:
                    raise_for_error(response)
            except (httpx.HTTPError, FabricError) as exc:
                log.info("mirror: %s did not drop a staged file's copy yet (%s); tried again", self.peer, exc)
                self._drops.put(rid)
                return

    def close(self, nothing_parked: bool) -> None:
        """Stop renewing; with ``nothing_parked`` end the lease (the peer forgets this mount),
        else leave it to run out (the peer stages what is left)."""
        self._stopped.set()
        self._senders.shutdown(wait=True)
        if self._renewer.is_alive():
            self._renewer.join()
        self._send_drops()
        if nothing_parked:
            try:
                response = self._http.delete("/lease")
                if response.status_code != 404:
                    raise_for_error(response)
            except (httpx.HTTPError, FabricError) as exc:
                log.warning("mirror: %s did not hear this mount end (%s); it stages nothing: every copy was dropped", self.peer, exc)
        self._http.close()

    def snapshot(self) -> dict[str, Any]:
        return {"peer": self.peer, "down": self._down, "kept": self.kept, "kept_bytes": self.kept_bytes,
                "appended": self.appended, "failed": self.failed, "switched": self.switched}


def _pieces(fd: int, size: int, offset: int = 0) -> Iterator[bytes]:
    while offset < size:
        piece = os.pread(fd, min(PIECE, size - offset), offset)
        if not piece:
            raise OSError(f"the parked file ended at {offset} of its {size} bytes")
        offset += len(piece)
        yield piece


def _ascii_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=True, separators=(",", ":"))


def _mount_id(write_dir: str) -> str:
    """This write-dir's id at the peer: made once, kept with the journal (a restarted mount
    renews the same lease and drops the same copies)."""
    path = os.path.join(write_dir, ID_FILE)
    try:
        with open(path) as f:
            value = f.read().strip()
        if len(value) == 32 and all(c in "0123456789abcdef" for c in value):
            return value
    except FileNotFoundError:
        pass
    value = uuid.uuid4().hex
    with open(path + ".tmp", "w") as f:
        f.write(value)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    return value
