"""``FabricFileSystem``: the repositories of a hub or spoke as an fsspec file system.

Paths are ``REPO@REF/path`` (``REF`` a branch, tag, commit id or ref expression) or
``REPO/path`` for the repository's default branch; ``''`` lists the repositories. Names
returned keep the form of the path asked about. Every call goes to the server through an
:class:`~fabric.client.http.HttpPlane`; nothing is cached between calls but a
repository's default branch and its branch names.

Reads fetch whole chunks by id (``stat_chunks``, then ``frames``): an open file reads the
version it had at open, whatever happens to the branch meanwhile, with readahead;
``cat_ranges`` and ``cat`` of many paths fetch the chunks of a whole batch in one request.

Writes go to a branch, staged (visible to reads of the branch at once): a file opened
``wb`` is stored on close, ``pipe``, ``cp``, ``mv`` and ``rm`` stage their changes. They
become history by :meth:`FabricFileSystem.commit`, or after every write when the file
system is made with ``commit="message"``. Writing to a tag or commit raises
PermissionError. Directories are those of an object store: they exist while a path lies
under them; ``mkdir`` and ``makedirs`` do nothing. As in the mount, a directory hides a file
of the same name from listings.
"""

from __future__ import annotations

import errno
import heapq
import io
import os
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from glob import has_magic
from operator import itemgetter
from typing import Any, BinaryIO, cast

from fsspec.spec import AbstractFileSystem

from fabric import errors
from fabric.cache.files import MIN_SIZE
from fabric.client.copies import open_copy, seeder
from fabric.client.http import HttpPlane
from fabric.client.spoke_files import SpokeFiles
from fabric.format.links import NAMES
from fabric.format.model import DIR, FILE, SYMLINK, Entry, stored_ids
from fabric.format.namespace import visible
from fabric.format.paths import is_full_commit_id
from fabric.fsspec import chunks
from fabric.fsspec.beside import SpokeBeside
from fabric.fsspec.entries import CommitEntries
from fabric.fsspec.errors import fs_errors, is_a_directory, not_a_directory, not_found
from fabric.fsspec.files import FabricReadFile, FabricWriteFile
from fabric.fsspec.locations import Location, parse
from fabric.util.heap import reuse_freed_buffers
from fabric.util.sizes import parse_size

#: Paths whose entries one ``cat``/``cat_ranges`` call looks up at once.
STAT_THREADS = 16
#: Deletions staged per request by ``rm``.
RM_BATCH = 1000
_IMPLICIT_DIR = Entry(kind=DIR)


class FabricFileSystem(AbstractFileSystem):
    """``server``: the hub's or spoke's URL, or several comma-separated, nearest first (the
    nearest healthy one is used, the next when it fails; default ``$FABRIC_SERVER``); ``token``: the
    bearer token (default ``$FABRIC_TOKEN``); ``commit``: a commit message, to commit the
    branch after every write; ``timeout``: seconds a request may wait; ``job``: the job
    its reads are accounted to at a spoke (``X-Fabric-Job``, default ``$FABRIC_JOB``);
    ``entries``: where entries read at a commit id are kept (default: a store of its own),
    so file systems of one process's forks can share what one of them listed; ``copies``: a
    directory of plain copies of file versions on this machine (default ``$FABRIC_COPIES``;
    :mod:`fabric.client.copies`): a file of 1 MiB or more opened or ``cat`` for reading whose
    version has a copy there is read from it, at the local disk's speed (checked whole first
    unless checked within the day), and each such file written here (``open``, ``pipe_file``)
    leaves one there (a checkpoint restored on the machine that saved it), within
    ``copies_size`` (least recently opened first). Only a directory no one else can write to:
    what is in it is what is read. It is shared with ``fabric mount --seed-copies DIR`` and ``--passthrough
    --copies-dir DIR``. ``durability``: when a write through a spoke returns (``local``: on
    the spoke's disk; ``replicated``: also on a peer spoke's; ``hub``: at the hub; default
    ``$FABRIC_DURABILITY``, else the spoke's ``--durability``), as ``fabric mount
    --durability`` asks; a hub meets every level. ``spoke_cache``: the ``--cache`` directory
    of the spoke ``server`` names, when it runs on this machine (default
    ``$FABRIC_SPOKE_CACHE``): the chunks its files hold are read from them, not sent over HTTP
    (:mod:`fabric.fsspec.beside`, as ``fabric mount --spoke-cache``); ValueError unless it is a
    spoke's cache directory.

    Creating one has the process keep the buffers it frees for reuse
    (:func:`fabric.util.heap.reuse_freed_buffers`: reads of large files take a third less
    CPU). ``FABRIC_MALLOC=glibc``, or any of glibc's ``MALLOC_*_`` variables, keeps glibc's
    own settings."""

    protocol = "fabric"
    root_marker = ""

    def __init__(
        self,
        server: str | None = None,
        token: str | None = None,
        commit: str | None = None,
        timeout: float = 300.0,
        job: str | None = None,
        entries: CommitEntries | None = None,
        copies: str | None = None,
        copies_size: int | str = "5G",
        durability: str | None = None,
        spoke_cache: str | None = None,
        **kwargs: Any,
    ) -> None:
        durability = durability or os.environ.get("FABRIC_DURABILITY") or None
        spoke_cache = spoke_cache or os.environ.get("FABRIC_SPOKE_CACHE") or None
        super().__init__(**kwargs)
        reuse_freed_buffers()
        server = server or os.environ.get("FABRIC_SERVER")
        if not server:
            raise ValueError("fabric://: no server: pass server=URL (storage_options) or set FABRIC_SERVER")
        token = token if token is not None else os.environ.get("FABRIC_TOKEN")
        with fs_errors("fabric://"):
            self.plane = HttpPlane(server, token or None, timeout=timeout, job=job, durability=durability)
        with fs_errors("fabric:// spoke_cache"):
            self.beside = SpokeBeside(spoke_cache, self.plane) if spoke_cache else None
        self.commit_message = commit
        self._default_branch: dict[str, str] = {}
        self._branches: dict[str, set[str]] = {}
        self._at_commit = entries if entries is not None else CommitEntries()
        self._stat_pool: ThreadPoolExecutor | None = None
        self._stat_pool_pid = 0
        self.copies = copies if copies is not None else os.environ.get("FABRIC_COPIES") or None
        self.copies_size = parse_size(copies_size) if isinstance(copies_size, str) else copies_size

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        return super()._strip_protocol(path).strip("/")

    def invalidate_cache(self, path: str | None = None) -> None:
        if path is None:
            self._default_branch.clear()
            self._branches.clear()

    # -- locations -----------------------------------------------------------------
    def _parse(self, path: str) -> tuple[str, Location | None]:
        path = self._strip_protocol(path)
        return path, parse(path)

    def _ref(self, loc: Location) -> str:
        """The ref a location reads: its own, or its repository's default branch."""
        if loc.ref is not None:
            return loc.ref
        branch = self._default_branch.get(loc.repo)
        if branch is None:
            with fs_errors(loc.root):
                branch = self._default_branch[loc.repo] = self.plane.get_repo(loc.repo)["default_branch"]
        return branch

    def _has_below(self, loc: Location, ref: str) -> bool:
        prefix = loc.key + "/" if loc.key else ""
        return bool(self.plane.list(loc.repo, ref, prefix, "", "", 1).entries)

    def _missing(self, path: str, loc: Location, ref: str) -> OSError:
        """NotADirectoryError if ``path``'s parent is a file, else FileNotFoundError."""
        parent = loc.key.rpartition("/")[0]
        if parent:
            try:
                if self.plane.stat(loc.repo, ref, parent).kind != DIR:
                    return not_a_directory(path, loc.name(parent))
            except errors.NotFound:
                pass
        return not_found(path)

    # -- metadata ------------------------------------------------------------------
    def _entry_info(self, name: str, e: Entry) -> dict[str, Any]:
        kind = "directory" if e.kind == DIR else "file" if e.kind == FILE else "other"
        info = {
            "name": name,
            "size": e.size if kind == "file" else 0,
            "type": kind,
            "mtime": e.mtime_ns / 1e9,
            "mode": e.mode,
            "etag": e.md5 or None,
            "islink": e.kind == SYMLINK,
        }
        if e.kind == SYMLINK:
            info["destination"] = e.target
        return info

    @staticmethod
    def _dir_info(name: str) -> dict[str, Any]:
        return {"name": name, "size": 0, "type": "directory"}

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        path, loc = self._parse(path)
        if loc is None:
            return self._dir_info("")
        with fs_errors(path):
            ref = self._ref(loc)
            if not loc.key:
                self.plane.resolve_commit(loc.repo, ref)  # the repository and ref exist
                return self._dir_info(path)
            try:
                entry: Entry | None = self.plane.stat(loc.repo, ref, loc.key)
            except errors.NotFound:
                entry = None
            if entry is not None and entry.kind == DIR:
                return self._entry_info(path, entry)
            if self._has_below(loc, ref):  # a directory hides a file of its name
                return self._dir_info(path)
        if entry is None:
            raise not_found(path)
        return self._entry_info(path, entry)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        path, loc = self._parse(path)
        if loc is None:
            with fs_errors(path):
                out = [self._dir_info(r["name"]) for r in self.plane.list_repos()]
        else:
            out = self._listdir(path, loc)
        return out if detail else [d["name"] for d in out]

    def _listdir(self, path: str, loc: Location) -> list[dict[str, Any]]:
        with fs_errors(path):
            ref = self._ref(loc)
            prefix = loc.key + "/" if loc.key else ""
            entries: list[tuple[str, Entry]] = []
            prefixes: list[str] = []
            after = ""
            while True:
                page = self.plane.list(loc.repo, ref, prefix, "/", after, 1000)
                entries += page.entries
                prefixes += page.prefixes
                if page.next_after is None:
                    break
                after = page.next_after
            merged = heapq.merge(entries, ((p, _IMPLICIT_DIR) for p in prefixes), key=itemgetter(0))
            out: dict[str, dict[str, Any]] = {}
            for key, entry in visible(merged):
                name = loc.name(key.rstrip("/"))
                if name not in out:  # a directory's marker comes before its prefix
                    out[name] = self._dir_info(name) if entry is _IMPLICIT_DIR else self._entry_info(name, entry)
            if out or not loc.key:
                return list(out.values())
            try:
                entry = self.plane.stat(loc.repo, ref, loc.key)
            except errors.NotFound:
                raise self._missing(path, loc, ref) from None
        return [] if entry.kind == DIR else [self._entry_info(path, entry)]

    def find(self, path: str, maxdepth: int | None = None, withdirs: bool = False, detail: bool = False, **kwargs: Any) -> Any:
        """All files below ``path`` (with ``withdirs``, directories too), from one walk of the
        tree. At a commit id, the entries whose chunk lists came with the walk are kept: reading
        those files later asks for no entry."""
        path, loc = self._parse(path)
        if loc is None:
            return super().find(path, maxdepth=maxdepth, withdirs=withdirs, detail=detail, **kwargs)
        if maxdepth is not None and maxdepth < 1:
            raise ValueError("maxdepth must be at least 1")
        out: dict[str, dict[str, Any]] = {}
        with fs_errors(path):
            ref = self._ref(loc)
            pinned = is_full_commit_id(ref)
            prefix = loc.key + "/" if loc.key else ""
            for key, entry in visible(self.plane.walk(loc.repo, ref, prefix)):
                parts = key[len(prefix) :].split("/")
                if withdirs:
                    for depth in range(1, min(len(parts), (maxdepth or len(parts)) + 1)):
                        name = loc.name(prefix + "/".join(parts[:depth]))
                        out.setdefault(name, self._dir_info(name))
                if maxdepth is not None and len(parts) > maxdepth or entry.kind == DIR and not withdirs:
                    continue
                out[loc.name(key)] = self._entry_info(loc.name(key), entry)
                if pinned and entry.kind == FILE and not entry.chunklist and (entry.chunks or not entry.size):
                    self._at_commit.put(loc.repo, ref, key, entry)
        if withdirs and (out or not loc.key):
            out[path] = self._dir_info(path)
        if not out:
            try:
                info = self.info(path)
            except FileNotFoundError:
                info = None
            if info is not None and (withdirs or info["type"] != "directory"):
                out[path] = info
        names = sorted(out)
        return {n: out[n] for n in names} if detail else names

    def modified(self, path: str) -> datetime:
        return datetime.fromtimestamp(self.info(path)["mtime"], tz=UTC)

    def pin(self, path: str) -> str:
        """``path`` (a URL or pattern; ``fabric://`` kept if given) with its ref replaced by the
        commit id it names now, so all later reads see that one version. Loaders that cache by
        URL need it: Hugging Face ``datasets`` keeps a downloaded file under its URL alone, so
        a branch URL loads what it downloaded first, whatever was committed since."""
        scheme = f"{self.protocol}://" if str(path).startswith(f"{self.protocol}://") else ""
        path, loc = self._parse(path)
        if loc is None:
            raise ValueError("pin needs a repository: REPO@REF/path")
        with fs_errors(path):
            commit = self.plane.resolve_commit(loc.repo, self._ref(loc))
        return scheme + Location(f"{loc.repo}@{commit}", loc.repo, commit, loc.key).name(loc.key)

    # -- reads ---------------------------------------------------------------------
    def _file_entry(self, path: str) -> tuple[Location, Entry]:
        """The location and entry (with its chunk list) of the file at ``path``."""
        return cast(tuple[Location, Entry], self._entry_of(path, cached_only=False))

    def _entry_of(self, path: str, cached_only: bool) -> tuple[Location, Entry] | None:
        """As :meth:`_file_entry`; with ``cached_only``, None unless the entry is kept (read
        at a commit id before), without a request."""
        path, loc = self._parse(path)
        if loc is None or not loc.key:
            raise is_a_directory(path)
        with fs_errors(path):
            ref = self._ref(loc)
            try:
                entry = self._at_commit.get(loc.repo, ref, loc.key)
                if entry is None and cached_only:
                    return None
                if entry is None:
                    entry = self.plane.stat_chunks(loc.repo, ref, loc.key)
                    if is_full_commit_id(ref):
                        self._at_commit.put(loc.repo, ref, loc.key, entry)
            except errors.NotFound:
                if self._has_below(loc, ref):
                    raise is_a_directory(path) from None
                raise self._missing(path, loc, ref) from None
        if entry.kind == DIR:
            raise is_a_directory(path)
        if entry.kind != FILE:
            raise OSError(errno.EINVAL, f"a {entry.kind}, not a regular file", path)
        return loc, entry

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict | None = None,
        **kwargs: Any,
    ) -> FabricReadFile | FabricWriteFile:
        path = self._strip_protocol(path)
        if mode == "rb":
            loc, entry = self._file_entry(path)
            if self.copies and (fd := open_copy(self.copies, entry)) is not None:
                return open(fd, "rb")  # (the version's copy on this machine's disk)
            info = self._entry_info(path, entry)
            return FabricReadFile(self, path, loc, entry, info, block_size=block_size, cache_options=cache_options, **kwargs)
        if mode in ("wb", "xb"):
            loc, _ = self._new_file(path, exclusive=mode == "xb")
            seeds = seeder(self.copies, self.copies_size) if self.copies else None
            return FabricWriteFile(self, path, loc, mode, block_size=block_size, autocommit=autocommit, seeds=seeds, **kwargs)
        raise ValueError(f"fabric://{path}: mode {mode!r} is not supported: open for reading (rb) or writing (wb, xb)")

    def hint(self, paths: list[str], append: bool = False) -> dict:
        """Tell the server the files this file system's job will read, in this order
        (:meth:`~fabric.plane.reads.Reads.hint`; a spoke fetches ahead of the reads). Paths
        of several repositories are hinted per repository, each in its own order (of one
        repository's refs, one after the other); ``append`` adds to orders hinted before. Answers the sums of the servers'
        answers (``job``, ``paths``, ``bytes``, ``window_bytes``)."""
        groups: dict[tuple[str, str], list[str]] = {}
        for path in paths:
            name, loc = self._parse(path)
            if loc is None or not loc.key:
                raise ValueError(f"fabric://{name}: a hint names files, not a repository")
            with fs_errors(name):
                groups.setdefault((loc.repo, self._ref(loc)), []).append(loc.key)
        total = {"job": self.plane.job, "paths": 0, "bytes": 0, "window_bytes": 0}
        hinted: set[str] = set()
        for (repo, ref), keys in groups.items():
            with fs_errors(f"{repo}@{ref}"):
                answer = self.plane.hint(repo, ref, keys, append=append or repo in hinted)
            hinted.add(repo)
            total.update(job=answer["job"], window_bytes=answer["window_bytes"])
            total["paths"] += answer["paths"]
            total["bytes"] += answer["bytes"]
        return total

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        result = self._read_many([(path, start, end)])[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def cat_ranges(
        self, paths: list, starts: Any, ends: Any, max_gap: int | None = None, on_error: str = "return", **kwargs: Any
    ) -> list:
        """Byte ranges of many files: the chunks of all of them in one request per batch
        (``max_gap`` is not needed: ranges are read as whole chunks)."""
        if not isinstance(paths, list):
            raise TypeError("paths must be a list")
        starts = starts if isinstance(starts, list) else [starts] * len(paths)
        ends = ends if isinstance(ends, list) else [ends] * len(paths)
        if not len(paths) == len(starts) == len(ends):
            raise ValueError("paths, starts and ends must have the same length")
        results = self._read_many(list(zip(paths, starts, ends)))
        if on_error != "return":
            for r in results:
                if isinstance(r, BaseException):
                    raise r
        return results

    def cat(self, path: Any, recursive: bool = False, on_error: str = "raise", **kwargs: Any) -> Any:
        """As fsspec's ``cat``, with the chunks of all the files in one request per batch."""
        paths = self.expand_path(path, recursive=recursive)
        if not (len(paths) > 1 or isinstance(path, list) or paths[0] != self._strip_protocol(path)):
            return self.cat_file(paths[0], **kwargs)
        results = self._read_many([(p, kwargs.get("start"), kwargs.get("end")) for p in paths])
        out = {}
        for p, r in zip(paths, results):
            if isinstance(r, IsADirectoryError) and recursive:
                continue  # a directory the expansion listed: its files are there too
            if isinstance(r, BaseException):
                if on_error == "raise":
                    raise r
                if on_error == "omit":
                    continue
            out[p] = r
        return out

    def _read_many(self, reads: list[tuple[str, int | None, int | None]]) -> list[bytes | BaseException]:
        """Each ``(path, start, end)`` read (Python slice bounds), or the exception it raised.

        The entries of distinct paths are looked up in parallel, then the chunks every
        range needs are fetched in one ``frames`` call per repository."""
        paths = list(dict.fromkeys(self._strip_protocol(p) for p, _, _ in reads))

        def lookup(p: str, cached_only: bool = False) -> tuple[Location, chunks.ChunkMap, int | None] | BaseException | None:
            """The file's location, chunks and local copy (a descriptor, or None)."""
            try:
                found = self._entry_of(p, cached_only)
                if found is None:
                    return None
                return found[0], chunks.ChunkMap(found[1]), open_copy(self.copies, found[1]) if self.copies else None
            except Exception as exc:  # noqa: BLE001 - returned to the caller, per path
                return exc

        found = {p: lookup(p, cached_only=True) for p in paths}  # kept entries: no request, no thread
        asks = [p for p, item in found.items() if item is None]
        if len(asks) == 1:
            found[asks[0]] = lookup(asks[0])
        elif asks:
            found.update(zip(asks, self._stat_threads().map(lookup, asks)))
        spans: list[tuple[str, int, int] | BaseException] = []
        wanted: dict[str, list[bytes]] = {}
        for p, start, end in reads:
            item = found[self._strip_protocol(p)]
            if isinstance(item, BaseException):
                spans.append(item)
                continue
            loc, cmap, copy = item
            s, e = _bounds(start, end, cmap.size)
            spans.append((self._strip_protocol(p), s, e))
            if copy is None:
                wanted.setdefault(loc.repo, []).extend(cmap.ids_for(s, e))
        fetched: dict[str, dict[bytes, bytes] | BaseException] = {}
        for repo, ids in wanted.items():
            try:
                with fs_errors(repo):
                    fetched[repo] = chunks.fetch(self.plane, repo, ids, beside=self.spoke_files(repo))
            except Exception as exc:  # noqa: BLE001 - every read of the repository fails with it
                fetched[repo] = exc
        out: list[bytes | BaseException] = []
        try:
            for span in spans:
                if isinstance(span, BaseException):
                    out.append(span)
                    continue
                p, s, e = span
                loc, cmap, copy = found[p]  # type: ignore[misc]
                if copy is not None:
                    out.append(_pread_all(copy, s, e))
                    continue
                got = fetched.get(loc.repo, {})
                out.append(got if isinstance(got, BaseException) else cmap.assemble(s, e, got))
        finally:
            for item in found.values():
                if isinstance(item, tuple) and item[2] is not None:
                    os.close(item[2])
        return out

    def spoke_files(self, repo: str) -> SpokeFiles | None:
        """The reader of the spoke's cache files for reads of ``repo`` (``spoke_cache``), if any."""
        return self.beside.files(repo) if self.beside is not None else None

    def _stat_threads(self) -> ThreadPoolExecutor:
        """The threads that look entries up in parallel, started once per process (a
        DataLoader worker forked from a parent that used them starts its own)."""
        if self._stat_pool is None or self._stat_pool_pid != os.getpid():
            self._stat_pool = ThreadPoolExecutor(STAT_THREADS, thread_name_prefix="fabric-fsspec-stat")
            self._stat_pool_pid = os.getpid()
        return self._stat_pool

    # -- writes --------------------------------------------------------------------
    def _branch(self, loc: Location, path: str) -> str:
        """The branch a write to ``loc`` goes to; PermissionError for a tag or commit."""
        ref = self._ref(loc)
        if ref in self._branches.get(loc.repo, ()):
            return ref
        with fs_errors(path):
            self._branches[loc.repo] = {b["name"] for b in self.plane.list_branches(loc.repo)}
            if ref in self._branches[loc.repo]:
                return ref
            if ref in {t["name"] for t in self.plane.list_tags(loc.repo)}:
                raise PermissionError(errno.EROFS, f"{loc.repo}@{ref} is a tag, and tags are read-only: write to a branch", path)
            try:
                self.plane.resolve_commit(loc.repo, ref)
            except errors.NotFound:
                raise not_found(path, f"repository {loc.repo} has no branch {ref!r}") from None
        raise PermissionError(errno.EROFS, f"{loc.repo}@{ref} is a commit, not a branch: history is read-only, write to a branch", path)

    def _writable(self, path: str) -> tuple[str, Location, str]:
        path, loc = self._parse(path)
        if loc is None or not loc.key:
            raise is_a_directory(path)
        return path, loc, self._branch(loc, path)

    def _new_file(self, path: str, exclusive: bool) -> tuple[Location, str]:
        """Where a new file at ``path`` goes: FileExistsError if ``exclusive`` and it exists,
        IsADirectoryError if paths lie under it."""
        path, loc, branch = self._writable(path)
        with fs_errors(path):
            if exclusive:
                try:
                    self.plane.stat(loc.repo, branch, loc.key)
                    raise FileExistsError(errno.EEXIST, "exists", path)
                except errors.NotFound:
                    pass
            if self._has_below(loc, branch):
                raise is_a_directory(path)
        return loc, branch

    def _store(self, loc: Location, stream: BinaryIO) -> None:
        """Store the content of :meth:`pipe_file` (then commit, with ``commit=``)."""
        branch = self._ref(loc)
        with fs_errors(loc.name(loc.key)):
            self.plane.put_object(loc.repo, branch, loc.key, stream)
        self._written(loc, branch)

    def _stage_file(self, loc: Location, entry: Entry) -> None:
        """Stage a file written through :meth:`open`, its chunks stored (then commit, with ``commit=``)."""
        branch = self._ref(loc)
        with fs_errors(loc.name(loc.key)):
            self.plane.stage(loc.repo, branch, {loc.key: entry})
        self._written(loc, branch)

    def _written(self, loc: Location, branch: str) -> None:
        if self.commit_message is not None:
            with fs_errors(loc.root):
                self.plane.commit(loc.repo, branch, self.commit_message, allow_empty=True)

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        if self.copies and len(value) >= MIN_SIZE:  # (written as opened files are: it leaves a copy)
            with self.open(path, "xb" if mode == "create" else "wb") as f:
                f.write(value)
            return
        loc, _ = self._new_file(path, exclusive=mode == "create")
        self._store(loc, io.BytesIO(value))

    def commit(self, path: str, message: str, allow_empty: bool = False) -> str:
        """Commit the staged changes of the branch ``path`` names (``REPO@BRANCH``, or ``REPO``
        for the default branch); returns the commit id. ValueError if nothing is staged."""
        path, loc = self._parse(path)
        if loc is None:
            raise ValueError("commit needs a repository and branch: REPO@BRANCH")
        branch = self._branch(loc, path)
        with fs_errors(path):
            return self.plane.commit(loc.repo, branch, message, allow_empty=allow_empty).id

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        """Nothing to do: a directory exists while a path lies under it (a bad path raises ValueError)."""
        self._parse(path)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self._parse(path)

    def rmdir(self, path: str) -> None:
        """Nothing to do for an empty directory; OSError(ENOTEMPTY) if paths lie under it."""
        path, loc = self._parse(path)
        if loc is not None:
            with fs_errors(path):
                if self._has_below(loc, self._ref(loc)):
                    raise OSError(errno.ENOTEMPTY, "directory not empty", path)

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        """Copy a file without moving its bytes (a directory: nothing to copy)."""
        self._copy(path1, path2, move=False)

    def _copy(self, path1: str, path2: str, move: bool) -> None:
        src_path, src = self._parse(path1)
        if src is None or not src.key:
            return
        try:
            _, entry = self._file_entry(src_path)
        except IsADirectoryError:
            return
        dst_path, dst, branch = self._writable(path2)
        changes: dict[str, Entry | None] = {}
        meta = {k: v for k, v in entry.meta.items() if k != NAMES}
        changes[dst.key] = entry.with_(mtime_ns=time.time_ns(), ctime_ns=None, link="", meta=meta)
        if move:
            changes[src.key] = None
        with fs_errors(dst_path):
            if src.repo != dst.repo:
                self.plane.share_chunks(src.repo, dst.repo, stored_ids(entry.chunks))
            self.plane.stage(dst.repo, branch, changes)
        self._written(dst, branch)

    def mv(self, path1: Any, path2: Any, recursive: bool = False, maxdepth: int | None = None, **kwargs: Any) -> None:
        """A file moved within one branch is one staged change (copy and delete together);
        anything else is fsspec's copy, then remove."""
        if isinstance(path1, str) and isinstance(path2, str) and not path2.endswith("/"):
            _, src = self._parse(path1)
            _, dst = self._parse(path2)
            if (
                src is not None and dst is not None and src.key and dst.key and src.repo == dst.repo
                and self._ref(src) == self._ref(dst) and self.isfile(path1) and not self.isdir(path2)
            ):
                self._copy(path1, path2, move=True)
                return
        super().mv(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)

    def rm_file(self, path: str) -> None:
        self.rm(path)

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        """Stage the deletion of files (with ``recursive``, everything under directories), one
        request per branch; FileNotFoundError for a path that names nothing, IsADirectoryError
        for a directory without ``recursive``. Globs remove what they match."""
        targets: list[tuple[str, bool]] = []
        for p in path if isinstance(path, list) else [path]:
            p = self._strip_protocol(p)
            if has_magic(p):
                targets += [(m, False) for m in self.glob(p)]
            else:
                targets.append((p, True))
        changes: dict[tuple[str, str], tuple[Location, dict[str, None]]] = {}
        for p, explicit in targets:
            p, loc = self._parse(p)
            if loc is None:
                raise ValueError("refusing to remove every repository: name one (REPO@BRANCH)")
            branch = self._branch(loc, p)
            keys = self._removal(p, loc, branch, recursive, maxdepth, explicit)
            changes.setdefault((loc.repo, branch), (loc, {}))[1].update(dict.fromkeys(keys))
        for (repo, branch), (loc, keys) in changes.items():
            batch = list(keys)
            for i in range(0, len(batch), RM_BATCH):
                with fs_errors(loc.root):
                    self.plane.stage(repo, branch, dict.fromkeys(batch[i : i + RM_BATCH]))
            if batch:
                self._written(loc, branch)

    def _removal(self, path: str, loc: Location, branch: str, recursive: bool, maxdepth: int | None, explicit: bool) -> list[str]:
        """The keys removing ``path`` deletes."""
        with fs_errors(path):
            entry = None
            if loc.key:
                try:
                    entry = self.plane.stat(loc.repo, branch, loc.key)
                except errors.NotFound:
                    pass
            prefix = loc.key + "/" if loc.key else ""
            if recursive:
                below = [k for k, _ in self.plane.walk(loc.repo, branch, prefix) if maxdepth is None or k[len(prefix) :].count("/") < maxdepth]
            else:
                below = [k for k, _ in self.plane.list(loc.repo, branch, prefix, "", "", 1).entries]
        if below and not recursive:
            if explicit:
                raise IsADirectoryError(errno.EISDIR, "is a directory: remove it with recursive=True", path)
            return []
        if entry is None and not below:
            if explicit:
                raise not_found(path)
            return []
        return ([loc.key] if entry is not None else []) + below


def _bounds(start: int | None, end: int | None, size: int) -> tuple[int, int]:
    """``[start, end)`` of a file of ``size`` bytes from slice-like bounds (negative: from the end)."""
    s = 0 if start is None else start + size if start < 0 else start
    e = size if end is None else end + size if end < 0 else end
    s, e = max(0, min(s, size)), max(0, min(e, size))
    return s, max(s, e)


def _pread_all(fd: int, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of the file open as ``fd`` (a local copy)."""
    parts, offset = [], start
    while offset < end:
        piece = os.pread(fd, end - offset, offset)
        if not piece:
            raise OSError(errno.EIO, f"a local copy ended at {offset} of {end} bytes")
        parts.append(piece)
        offset += len(piece)
    return b"".join(parts)
