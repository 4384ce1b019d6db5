"""Import a local directory into a branch, and export a ref to a directory."""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import stat as stat_mod
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import BinaryIO, NamedTuple

from fabric.client.destdir import DestDir
from fabric.client.filereader import batches, ingest_files
from fabric.client.filters import FileList, Filters
from fabric.client.hardlinks import local_groups, second_names, stored_group
from fabric.errors import BadRequest, Conflict, Corruption, FabricError, NotFound
from fabric.format import frames
from fabric.format.chunking import chunk_id, cut, cut_stream
from fabric.format.filetypes import kind_of_mode
from fabric.format.links import names
from fabric.format.model import BLOCKDEV, CHARDEV, DEFAULT_DIR_MODE, DIR, FILE, HOLE_ID, SPECIAL_KINDS, SYMLINK, Commit, Entry
from fabric.format.namespace import visible
from fabric.format.paths import check_path
from fabric.plane.dataplane import DataPlane
from fabric.util.progress import Progress

log = logging.getLogger("fabric.client")


@dataclass
class ImportResult:
    commit: Commit | None
    files: int = 0
    added: int = 0
    changed: int = 0
    removed: int = 0
    bytes_hashed: int = 0
    new_chunks: int = 0
    new_bytes: int = 0
    stored_bytes: int = 0
    skipped: list[str] = field(default_factory=list)
    #: Paths of the source left out by ``--exclude`` patterns (a directory stands for all under it).
    excluded: list[str] = field(default_factory=list)
    #: A dry run: nothing was read, stored or committed; ``plan`` lists what would change.
    dry_run: bool = False
    #: Of a dry run: the paths that would be added, changed (or read again) and removed.
    plan: dict[str, list[str]] = field(default_factory=dict)

    def describe(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k not in ("commit", "plan") and (k != "dry_run" or v)}
        d["commit_id"] = self.commit.id if self.commit else None
        if self.dry_run:
            d["plan"] = self.plan
        return d


class LocalItem(NamedTuple):
    """What the walk found at one path before any file is read (a tuple: an import holds one
    per local path until it commits, and makes one per path twice as fast as a frozen
    dataclass)."""

    path: str
    abspath: str
    kind: str
    size: int = 0
    mode: int = 0
    mtime_ns: int = 0
    target: str = ""
    #: ``(st_dev, st_ino)`` of a file with more than one name (a hard link), else None.
    inode: tuple[int, int] | None = None
    #: The device number of a character or block device.
    rdev: int = 0


def normalize_prefix(prefix: str) -> str:
    prefix = prefix.strip("/")
    if prefix:
        check_path(prefix)
        return prefix + "/"
    return ""


def walk(
    root: str,
    prefix: str = "",
    skipped: list[str] | None = None,
    filters: Filters | None = None,
    excluded: list[str] | None = None,
    files: FileList | None = None,
) -> Iterator[LocalItem]:
    """Files, symlinks, and the directories that need an entry of their own (unordered):
    empty ones, and those whose mode is not :data:`DEFAULT_DIR_MODE`. What ``filters``
    leaves out is not entered nor yielded; its paths go to ``excluded``. With ``files``,
    only what it holds and the directories on the way to it are."""
    stack = [(root, prefix)]
    while stack:
        dir_abs, dir_rel = stack.pop()
        try:
            entries = list(os.scandir(dir_abs))
        except PermissionError as exc:
            raise BadRequest(f"cannot read directory {dir_abs!r}: {exc.strerror}") from exc
        if files is not None:
            entries = [de for de in entries if files.wanted(dir_rel[len(prefix) :] + de.name, de.is_dir(follow_symlinks=False))]
        if filters:
            entries = _kept(entries, dir_rel[len(prefix) :], filters, excluded)
        if dir_rel and dir_rel != prefix:
            st = os.lstat(dir_abs)
            mode = stat_mod.S_IMODE(st.st_mode)
            if not entries or mode != DEFAULT_DIR_MODE:
                yield LocalItem(dir_rel.rstrip("/"), dir_abs, DIR, 0, mode, st.st_mtime_ns)
        for de in entries:
            rel = dir_rel + de.name
            try:
                rel.encode("utf-8")
            except UnicodeEncodeError:
                raise BadRequest(
                    f"file name {os.fsencode(de.path)!r} is not valid UTF-8; rename it before importing"
                ) from None
            st = de.stat(follow_symlinks=False)
            if stat_mod.S_ISDIR(st.st_mode):
                stack.append((de.path, rel + "/"))
            elif stat_mod.S_ISREG(st.st_mode):
                inode = (st.st_dev, st.st_ino) if st.st_nlink > 1 else None
                yield LocalItem(rel, de.path, FILE, st.st_size, stat_mod.S_IMODE(st.st_mode), st.st_mtime_ns, inode=inode)
            elif stat_mod.S_ISLNK(st.st_mode):
                yield LocalItem(rel, de.path, SYMLINK, 0, 0o777, st.st_mtime_ns, os.readlink(de.path))
            elif (kind := kind_of_mode(st.st_mode)) in SPECIAL_KINDS:
                rdev = st.st_rdev if kind in (CHARDEV, BLOCKDEV) else 0
                yield LocalItem(rel, de.path, kind, 0, stat_mod.S_IMODE(st.st_mode), st.st_mtime_ns, rdev=rdev)
            elif skipped is not None:
                skipped.append(rel)


def _some(paths: list[str]) -> str:
    """The first few of ``paths``, for a message."""
    return ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")


def _kept(entries: list[os.DirEntry], dir_rel: str, filters: Filters, excluded: list[str] | None) -> list[os.DirEntry]:
    """The ``entries`` of the directory ``dir_rel`` (relative to the walk's root) no rule leaves out."""
    kept = []
    for de in entries:
        rel = dir_rel + de.name
        if filters.excluded(rel, de.is_dir(follow_symlinks=False)):
            if excluded is not None:
                excluded.append(rel)
        else:
            kept.append(de)
    return kept


def same_file(a: Entry, b: Entry) -> bool:
    """Same content and attributes (chunk lists may differ in form, not in bytes)."""
    return (a.kind, a.size, a.mode, a.mtime_ns, a.md5) == (b.kind, b.size, b.mode, b.mtime_ns, b.md5)


def _unchanged(item: LocalItem, old: Entry | None, group: tuple[str, ...] = ()) -> bool:
    """``group``: the names of the file's hard-link group in the import (``()``: one name)."""
    if old is None or old.kind != item.kind or old.mode != item.mode:
        return False
    if item.kind == FILE:
        return old.size == item.size and old.mtime_ns == item.mtime_ns and names(item.path, old) == group
    if item.kind == SYMLINK:
        return old.target == item.target
    return old.rdev == item.rdev


def import_directory(
    plane: DataPlane,
    src: str,
    repo: str,
    branch: str,
    message: str,
    prefix: str = "",
    delete: bool = True,
    rehash: bool = False,
    author: str | None = None,
    progress: Progress | None = None,
    filters: Filters | None = None,
    delete_excluded: bool = False,
    dry_run: bool = False,
    files: FileList | None = None,
) -> ImportResult:
    """Make ``repo@branch`` (under ``prefix``) equal to directory ``src`` and commit.

    Files whose size, mode and mtime match the branch's entry are not read
    again (``rehash`` reads everything). With ``delete=False`` paths missing
    from ``src`` are kept. What ``filters`` leaves out of ``src`` is not imported, and
    kept on the branch unless ``delete_excluded`` (as rsync's ``--exclude`` and
    ``--delete-excluded``). ``dry_run``: read, store and commit nothing; the result's
    ``plan`` lists what would change. Returns a result with ``commit=None`` when nothing
    changed. ``files``: only these paths of ``src`` (a directory with everything under it)
    are imported, and only paths they hold are removed from the branch; NotFound, before
    anything is read, when one of them is not in ``src``.
    """
    progress = progress or Progress()
    if not os.path.isdir(src):
        raise BadRequest(f"{src!r} is not a directory")
    prefix = normalize_prefix(prefix)
    head = plane.resolve_commit(repo, branch)
    result = ImportResult(None, dry_run=dry_run)
    local = {item.path: item for item in walk(os.path.abspath(src), prefix, result.skipped, filters, result.excluded, files)}
    for path in local:
        check_path(path)
    if files is not None and (missing := files.missing([p[len(prefix) :] for p in local] + result.excluded)):
        raise NotFound(f"{len(missing)} path(s) of the file list are not in {src}: {_some(missing)}")
    result.files = len(local)
    existing = dict(plane.walk(repo, head, prefix))

    changes: dict[str, Entry | None] = {}
    to_hash: list[LocalItem] = []
    groups = local_groups((p, i.inode) for p, i in local.items() if i.kind == FILE)
    for path, item in local.items():
        group = groups.get(path, ())
        if group and (path != group[0] or all(_unchanged(local[p], existing.get(p), group) for p in group) and not rehash):
            continue  # a hard-link group is read once, through its first name, and stored at all of them
        old = existing.get(path)
        if _unchanged(item, old, group) and not (rehash and item.kind == FILE):  # rehash re-reads files only
            continue
        if item.kind == FILE:
            to_hash.append(item)
        elif item.kind == SYMLINK:
            changes[path] = Entry(SYMLINK, len(item.target), 0o777, item.mtime_ns, target=item.target)
        elif item.kind in SPECIAL_KINDS:
            changes[path] = Entry(item.kind, 0, item.mode, item.mtime_ns, rdev=item.rdev)
        else:
            changes[path] = Entry(DIR, 0, item.mode, item.mtime_ns)
    if delete:
        for path in existing.keys() - local.keys():
            if filters and not delete_excluded and filters.covers(path[len(prefix) :], existing[path].kind == DIR):
                continue  # left out of the import, so neither sent nor removed
            if files is not None and not files.holds(path[len(prefix) :]):
                continue  # not in the list: not part of this import
            changes[path] = None
    if dry_run:
        return _planned(result, changes, to_hash, existing, groups)
    # Memory: from here on only the items of files to read are kept, and those only
    # until they are read (the commit of 100,000 new files reuses the room).
    del local
    result.bytes_hashed = sum(i.size for i in to_hash)

    progress.start(result.bytes_hashed, "B", "import")
    session = plane.chunk_sink(repo)
    read = ingest_files(to_hash, session, progress)
    del to_hash
    for path, entry in read:
        old = existing.get(path)
        if path in groups:
            changes.update(stored_group(groups[path], entry, existing))
            continue
        if rehash and old is not None and same_file(old, entry) and not names(path, old):
            continue
        changes[path] = entry
    session.close()
    progress.close()
    result.new_chunks, result.new_bytes, result.stored_bytes = session.new_chunks, session.new_bytes, session.stored_bytes
    for path, entry in changes.items():
        if entry is None:
            result.removed += 1
        elif path in existing:
            result.changed += 1
        else:
            result.added += 1
    if changes:
        result.commit = plane.commit_changes(repo, branch, changes, message, author=author, expected_head=head)
    return result


def _planned(
    result: ImportResult,
    changes: dict[str, Entry | None],
    to_hash: list[LocalItem],
    existing: dict[str, Entry],
    groups: dict[str, tuple[str, ...]],
) -> ImportResult:
    """``result`` of a dry run: what the import would add, change (files: read again) and
    remove. A hard-link group to be read is listed under each of its names."""
    plan: dict[str, list[str]] = {"add": [], "change": [], "remove": []}
    for path, entry in changes.items():
        plan["remove" if entry is None else "change" if path in existing else "add"].append(path)
    for item in to_hash:
        for name in groups.get(item.path, (item.path,)):
            plan["change" if name in existing else "add"].append(name)
    for paths in plan.values():
        paths.sort()
    result.plan = plan
    result.added, result.changed, result.removed = len(plan["add"]), len(plan["change"]), len(plan["remove"])
    result.bytes_hashed = sum(item.size for item in to_hash)
    return result


@dataclass
class ExportResult:
    #: Files, and their bytes, of the exported tree (written or left as they were).
    files: int = 0
    bytes: int = 0
    #: Files already in the destination with the entry's size, mode and mtime: not written.
    unchanged: int = 0
    unchanged_bytes: int = 0
    dirs: int = 0
    symlinks: int = 0
    #: FIFOs, sockets and devices written.
    specials: int = 0
    #: Files and symlinks not written: a directory of the same name shadows them.
    shadowed: list[str] = field(default_factory=list)
    #: Special files not written: devices, without the privilege to make them (CAP_MKNOD).
    skipped: list[str] = field(default_factory=list)
    #: With ``delete``: the paths removed from the destination (a directory stands for all in it).
    deleted: list[str] = field(default_factory=list)
    #: With ``checksum``: files that failed the quick check but held the entry's chunks (kept,
    #: their mode and time set; counted in ``unchanged`` too).
    verified: int = 0
    #: A dry run: nothing was written or removed; ``to_write`` and ``deleted`` say what would be.
    dry_run: bool = False
    to_write: list[str] = field(default_factory=list)


#: Threads of an export writing files: they wait on the network, so there are more of them
#: than CPUs (a file costs at least one round trip to the server).
EXPORT_WORKERS = 16

Batch = list[tuple[str, Entry]]


def new_export_job() -> str:
    """A job id for one export's reads (``X-Fabric-Job``), under which its read order is hinted."""
    return f"export:{uuid.uuid4().hex[:16]}"


def export_tree(
    plane: DataPlane,
    repo: str,
    ref: str,
    dest: str,
    prefix: str = "",
    progress: Progress | None = None,
    rewrite: bool = False,
    job: str | None = None,
    delete: bool = False,
    dry_run: bool = False,
    filters: Filters | None = None,
    delete_excluded: bool = False,
    checksum: bool = False,
    files: FileList | None = None,
) -> ExportResult:
    """Write the files of the commit ``repo@ref`` points at (under ``prefix``) into ``dest``.

    Committed data only: a branch's uncommitted changes are not exported.
    Existing files at the same paths are replaced; other files in ``dest`` are
    left alone, unless ``delete``: then everything in ``dest`` the tree does not hold is
    removed first (as ``rsync --delete``), a directory where the tree has a file included,
    and the result lists it in ``deleted``. ``dry_run``: nothing is written or removed;
    the result lists what would be (``to_write``, ``deleted``). What ``filters`` leaves out
    (paths relative to ``prefix``) is not written, and with ``delete`` not removed from
    ``dest`` either unless ``delete_excluded`` (as rsync's ``--exclude``). Modes and
    modification times are restored. A regular file
    already in ``dest`` with the entry's size, mode and mtime (to the
    nanosecond) is left as it is and counted in the result's ``unchanged``
    (rsync's quick check); ``rewrite`` writes every file. ``checksum``: a file of the
    entry's size that fails the quick check is read and cut into chunks as the repository
    cuts them; with the entry's chunk ids it is kept, its mode and time set, and counted in
    ``verified`` too (rsync's ``--checksum``). ``files``: only these paths (relative to
    ``prefix``) are written, a directory with everything under it; NotFound, before anything
    is written, when one of them is not in the tree.

    ``job``: the job id the plane's reads carry (``X-Fabric-Job``, e.g.
    ``HttpPlane(job=)``). Given, the files to read are first sent to the plane
    as that job's read order (:meth:`DataPlane.hint`), so a spoke fetches them
    from its hub ahead of the reads, in large batches. The hint is best effort:
    a plane that refuses it (a hub only checks it) changes nothing.

    Nothing is written outside ``dest`` (see :class:`DestDir`): no symlink is
    followed, whether the commit holds it or ``dest`` already did. A file or
    symlink in ``dest`` where the commit has a directory is replaced by a
    directory; a directory in ``dest`` where the commit has a file or symlink is
    a Conflict unless ``delete`` (what was written before stays).
    A file or symlink with paths below it in the tree (S3 lets keys ``a`` and
    ``a/b`` coexist) is shadowed by the directory (:mod:`fabric.format.namespace`):
    it is not written, and its path is listed in the result's ``shadowed``.
    The names of a hard-link group are exported as hard links of one file
    (:mod:`fabric.client.hardlinks`). FIFOs, sockets and devices are made again; a
    device needs the privilege to make one (root): without it, it is listed in the
    result's ``skipped``.
    """
    progress = progress or Progress()
    prefix = normalize_prefix(prefix)
    commit = plane.resolve_commit(repo, ref)
    listed = sorted(plane.walk(repo, commit, prefix), key=lambda it: it[0])
    if prefix and not listed:
        raise NotFound(f"nothing under {prefix!r} in {repo}@{ref}")
    result = ExportResult()
    made: list[str] = []  # special files written
    items = list(visible(listed, result.shadowed))
    result.shadowed.sort()

    def local(path: str) -> str:
        if not path.startswith(prefix):
            raise Corruption(f"the listing of {prefix!r} in {repo}@{ref} holds {path!r}")
        return check_path(path[len(prefix) :])

    if files is not None:
        items, missing = files.select(items, lambda item: local(item[0]))
        if missing:
            raise NotFound(f"{len(missing)} path(s) of the file list are not in {repo}@{ref}{f' under {prefix!r}' if prefix else ''}: {_some(missing)}")
    if filters:
        items = [(p, e) for p, e in items if not filters.covers(local(p), e.kind == DIR)]

    dirs = {local(p) for p, e in items if e.kind == DIR}
    linked_to = second_names(items)  # hard links: made after their first name is written
    by_dir: dict[str, Batch] = {}
    for path, entry in items:
        parts = local(path).split("/")
        dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
        if entry.kind != DIR and path not in linked_to:
            by_dir.setdefault("/".join(parts[:-1]), []).append((path, entry))

    others = {local(p) for p, e in items if e.kind != DIR}

    def in_tree(rel: str, is_dir: bool) -> bool:
        """Whether ``dest`` keeps ``rel`` under ``delete``: the tree has it, or it is excluded (and kept)."""
        if filters and not delete_excluded and filters.covers(rel, is_dir):
            return True
        return rel in dirs if is_dir else rel in others

    def same(f: BinaryIO, path: str, entry: Entry) -> bool:
        """Whether the open local file ``f`` holds ``entry``'s chunks."""
        chunks = plane.stat_chunks(repo, commit, path).chunks if entry.chunklist else entry.chunks
        local_chunks = ((chunk_id(piece), len(piece)) for piece in cut_stream(f))
        return all(a == tuple(b) for a, b in itertools.zip_longest(local_chunks, chunks, fillvalue=()))

    if dry_run:
        plan = _export_plan(dest, by_dir, local, in_tree if delete else None, rewrite, items, result, same if checksum else None, progress)
        progress.close()
        return plan
    with DestDir(dest) as out:
        if delete:
            result.deleted = out.prune(in_tree)
        for rel in sorted(dirs):  # parents first
            out.make_dir(rel)
        if not rewrite:
            by_dir = _drop_unchanged(out, by_dir, local, result, same=same if checksum else None, progress=progress)
        tasks = [(parent, batch) for parent, files in by_dir.items() for batch in batches(files, lambda it: it[1].size)]
        to_read = [p for _, batch in tasks for p, e in batch if e.kind == FILE]
        total = sum(e.size for _, batch in tasks for _, e in batch if e.kind == FILE)
        progress.start(total, "B", f"export ({result.unchanged} unchanged)" if result.unchanged else "export")

        def write(task: tuple[str, Batch]) -> None:
            parent, batch = task
            chunks = _chunk_lists(plane, repo, commit, batch)
            with out.directory(parent) as dir_fd:
                local_chunks = _old_chunks(out, dir_fd, [local(p) for p in chunks])
                needed = [c for cl in chunks.values() for c in cl if c[0] != HOLE_ID and c[0] not in local_chunks]
                feed = _Feed(plane, repo, needed, fetcher, ahead, local_chunks)
                with contextlib.closing(feed):
                    _write_batch(dir_fd, batch, chunks, feed)

        def _write_batch(dir_fd: int, batch: Batch, chunks: dict[str, Sequence[tuple[bytes, int]]], feed: _Feed) -> None:
            for path, entry in batch:
                if entry.kind == SYMLINK:
                    out.write_symlink(dir_fd, local(path), entry.target, entry.mtime_ns)
                elif entry.kind in SPECIAL_KINDS:
                    if out.write_special(dir_fd, local(path), entry.kind, entry.mode, entry.rdev, entry.mtime_ns):
                        made.append(path)
                    else:
                        result.skipped.append(path)
                else:
                    pieces = _advancing(_file_pieces(chunks[path], feed), progress)
                    out.write_file(dir_fd, local(path), pieces, entry.mode, entry.mtime_ns)

        ahead = threading.Semaphore(EXPORT_AHEAD)
        with ThreadPoolExecutor(EXPORT_WORKERS) as pool, ThreadPoolExecutor(EXPORT_WORKERS) as fetcher:
            hinted = None
            if job is not None and to_read:  # sent while the first files are read: no round trip to wait for
                hinted = fetcher.submit(_announce, plane, repo, commit, to_read, job)
            for _ in pool.map(write, tasks):
                pass
            if hinted is not None:
                hinted.result()  # a refusal was logged; anything else is a bug to see
        for path, first in linked_to.items():
            out.link(local(first), local(path))
        # Deepest first: a directory's time is set after its children changed it, and a
        # read-only mode cannot stop its own children from being written.
        for path, entry in sorted(((p, e) for p, e in items if e.kind == DIR), key=lambda it: it[0].count("/"), reverse=True):
            out.set_dir_attrs(local(path), entry.mode, entry.mtime_ns)
    progress.close()
    _count(items, result)
    result.specials = len(made)
    result.skipped.sort()
    return result


def _export_plan(
    dest: str,
    by_dir: dict[str, Batch],
    local: Callable[[str], str],
    in_tree: Callable[[str, bool], bool] | None,
    rewrite: bool,
    items: list[tuple[str, Entry]],
    result: ExportResult,
    same: SameContent | None,
    progress: Progress,
) -> ExportResult:
    """``result`` of a dry run: what an export would write, and remove (``in_tree`` given)."""
    result.dry_run = True
    if os.path.lexists(dest):
        with DestDir(dest) as out:  # (a directory already: nothing is made)
            if in_tree is not None:
                result.deleted = out.prune(in_tree, dry_run=True)
            if not rewrite:
                by_dir = _drop_unchanged(out, by_dir, local, result, missing_ok=True, same=same, dry_run=True, progress=progress)
    result.to_write = sorted(local(path) for batch in by_dir.values() for path, _ in batch)
    _count(items, result)
    return result


#: Threads reading and cutting local files for ``checksum``.
CHECKSUM_WORKERS = 4
#: Whether an open local file holds an entry's content: ``same(file, path, entry)``.
SameContent = Callable[[BinaryIO, str, Entry], bool]


def _drop_unchanged(
    out: DestDir,
    by_dir: dict[str, Batch],
    local: Callable[[str], str],
    result: ExportResult,
    missing_ok: bool = False,
    same: SameContent | None = None,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> dict[str, Batch]:
    """``by_dir`` without the files ``out`` already holds unchanged (counted in ``result``).
    ``missing_ok``: a directory that is missing, or no directory, holds nothing unchanged.
    ``same``: a file of the entry's size that fails the quick check is read, and kept if it
    holds the entry's content, its mode and time then set (not in a ``dry_run``); the bytes
    read go to ``progress``."""
    kept: dict[str, Batch] = {}
    progress = progress or Progress()

    def verify(dir_fd: int, item: tuple[str, Entry]) -> bool:
        path, entry = item
        try:
            return _verified(out, dir_fd, local(path), path, entry, same, dry_run)  # type: ignore[arg-type]
        finally:
            progress.advance(entry.size)

    if same is not None:
        progress.start(None, "B", "checking files by content")
    with ThreadPoolExecutor(CHECKSUM_WORKERS) as pool:
        for parent, batch in by_dir.items():
            try:
                with out.directory(parent) as dir_fd:
                    stale = [
                        (path, entry)
                        for path, entry in batch
                        if entry.kind == FILE and not out.unchanged(dir_fd, local(path), entry.size, entry.mode, entry.mtime_ns)
                    ]
                    if same is not None:  # read and cut in threads: chunking and BLAKE3 let go of the GIL
                        checks = list(pool.map(functools.partial(verify, dir_fd), stale))
                        result.verified += sum(checks)
                        stale = [it for it, same_bytes in zip(stale, checks, strict=True) if not same_bytes]
                    written = {path for path, _ in stale}
                    rest = []
                    for path, entry in batch:
                        if entry.kind == FILE and path not in written:
                            result.unchanged += 1
                            result.unchanged_bytes += entry.size
                        else:
                            rest.append((path, entry))
            except (FileNotFoundError, Conflict):
                if not missing_ok:
                    raise
                rest = batch
            if rest:
                kept[parent] = rest
    return kept


def _verified(out: DestDir, dir_fd: int, rel: str, path: str, entry: Entry, same: SameContent, dry_run: bool) -> bool:
    """Whether ``rel`` is a regular file of ``entry``'s size holding its content; its mode and
    time are then set to the entry's, through the open file (unless ``dry_run``)."""
    with out.open_regular(dir_fd, rel) as f:
        if f is None or os.fstat(f.fileno()).st_size != entry.size or not same(f, path, entry):
            return False
        if not dry_run:
            os.fchmod(f.fileno(), entry.mode)
            os.utime(f.fileno(), ns=(entry.mtime_ns, entry.mtime_ns))
    return True


def _announce(plane: DataPlane, repo: str, commit: str, paths: list[str], job: str) -> None:
    """Tell the plane ``job`` reads ``paths`` in this order; a refusal is only logged."""
    try:
        reply = plane.hint(repo, commit, paths, job)
    except FabricError as exc:
        log.debug("export: hint of %d paths for job %s refused: %s", len(paths), job, exc.message)
        return
    log.debug("export: hinted %d paths (%d bytes) for job %s, window %d", reply["paths"], reply["bytes"], job, reply["window_bytes"])


def _count(items: list[tuple[str, Entry]], result: ExportResult) -> None:
    for _, entry in items:
        if entry.kind == FILE:
            result.files += 1
            result.bytes += entry.size
        elif entry.kind == DIR:
            result.dirs += 1
        elif entry.kind == SYMLINK:
            result.symlinks += 1


#: Bytes of chunks an export asks for in one ``frames`` call (a window of a task's files).
EXPORT_WINDOW = 4 * 1024 * 1024
#: Windows fetched ahead of those being written, all tasks of an export together: besides the
#: window each writing thread holds, an export holds at most this many (memory), and a single
#: large file keeps this many requests in flight (bandwidth over a long round trip).
EXPORT_AHEAD = 8


class _Feed:
    """The raw bytes of a task's chunks, in the order its files are written: one ``frames``
    call per window of :data:`EXPORT_WINDOW` bytes, later windows fetched by ``fetcher``
    while earlier ones are written, as far as the export's shared budget ``ahead`` allows.
    Each frame is checked against its id."""

    def __init__(
        self,
        plane: DataPlane,
        repo: str,
        ids: list[tuple[bytes, int]],
        fetcher: ThreadPoolExecutor,
        ahead: threading.Semaphore,
        local: dict[bytes, memoryview] | None = None,
    ) -> None:
        """``ids``: the chunks to fetch, in order; ``local``: chunks at hand (by id), never fetched."""
        self._plane, self._repo, self._fetcher, self._ahead = plane, repo, fetcher, ahead
        self._local = local or {}
        self._windows = _windows(ids)
        self._next = 0  # the first window not asked for yet
        self._pending: deque[tuple[Future[dict[bytes, bytes]], bool]] = deque()  # and: holds a budget slot
        self._current: dict[bytes, bytes] = {}

    def take(self, cid: bytes) -> bytes:
        """The bytes of ``cid``, the next chunk of the order (a window is dropped once passed)."""
        raw = self._local.get(cid) or self._current.get(cid)
        if raw is None:
            self._current = self._advance()
            raw = self._current.get(cid)
            if raw is None:
                raise Corruption(f"chunk {cid.hex()} asked out of the export's order")
        return raw

    def close(self) -> None:
        """Give back the budget of windows fetched ahead and not used (an export that failed)."""
        while self._pending:
            fut, slot = self._pending.popleft()
            fut.cancel()
            if slot:
                self._ahead.release()

    def _advance(self) -> dict[bytes, bytes]:
        if not self._pending:
            self._ask(slot=False)
        fut, slot = self._pending.popleft()
        if slot:
            self._ahead.release()
        while self._next < len(self._windows) and self._ahead.acquire(blocking=False):
            self._ask(slot=True)
        return fut.result()

    def _ask(self, slot: bool) -> None:
        if self._next >= len(self._windows):
            raise Corruption("the export read past its chunk list")
        window = self._windows[self._next]
        self._next += 1
        self._pending.append((self._fetcher.submit(_fetch_window, self._plane, self._repo, window), slot))


#: A file of at most this size already at a path an export writes is read first: the chunks
#: it shares with the new version are taken from it, not fetched (rsync's basis file).
BASIS_MAX = 8 * 1024 * 1024


def _old_chunks(out: DestDir, dir_fd: int, rels: list[str]) -> dict[bytes, memoryview]:
    """The chunks of the files at ``rels`` in ``out`` (regular files of at most
    :data:`BASIS_MAX` bytes, :data:`BASIS_MAX` in all), by id: cut as the repository's
    chunker cuts, so a chunk the new version shares has the same id."""
    found: dict[bytes, memoryview] = {}
    budget = BASIS_MAX
    for rel in rels:
        old = out.read_small(dir_fd, rel, budget)
        if not old:
            continue
        budget -= len(old)
        for piece in cut(old):
            found.setdefault(chunk_id(piece), piece)
    return found


def _windows(ids: list[tuple[bytes, int]]) -> list[list[bytes]]:
    """Distinct ids of consecutive runs of ``ids`` of at most :data:`EXPORT_WINDOW` bytes (or one chunk)."""
    out: list[list[bytes]] = []
    window: dict[bytes, None] = {}
    size = 0
    for cid, n in ids:
        if window and size + n > EXPORT_WINDOW and cid not in window:
            out.append(list(window))
            window, size = {}, 0
        if cid not in window:
            window[cid] = None
            size += n
    if window:
        out.append(list(window))
    return out


def _fetch_window(plane: DataPlane, repo: str, ids: list[bytes]) -> dict[bytes, bytes]:
    wanted = set(ids)
    got: dict[bytes, bytes] = {}
    for cid, frame in plane.frames(ids, repo=repo):
        if cid in wanted and cid not in got:
            got[cid] = frames.decode(frame, cid)
    if len(got) != len(wanted):
        lost = next(cid for cid in ids if cid not in got)
        raise Corruption(f"the server sent {len(got)} of {len(ids)} chunks asked for (first missing: {lost.hex()})")
    return got


def _chunk_lists(plane: DataPlane, repo: str, commit: str, batch: Batch) -> dict[str, Sequence[tuple[bytes, int]]]:
    """The chunk list of each file of ``batch``; a long one (not inline) is fetched."""
    return {
        path: plane.stat_chunks(repo, commit, path).chunks if entry.chunklist else entry.chunks
        for path, entry in batch
        if entry.kind == FILE
    }


def _file_pieces(chunks: Sequence[tuple[bytes, int]], feed: _Feed) -> Iterator[bytes | int]:
    """The content of a file to export: its bytes, and for each hole of a sparse file its
    length (an int: :meth:`DestDir.write_file` leaves a hole), whose zeros are never read."""
    for cid, n in chunks:
        yield n if cid == HOLE_ID else feed.take(cid)


def _advancing(pieces: Iterator[bytes | int], progress: Progress) -> Iterator[bytes | int]:
    for piece in pieces:
        progress.advance(piece if isinstance(piece, int) else len(piece))
        yield piece
