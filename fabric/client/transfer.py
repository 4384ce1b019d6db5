"""Import a local directory into a branch, and export a ref to a directory."""

from __future__ import annotations

import itertools
import os
import stat as stat_mod
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from fabric.client.destdir import DestDir
from fabric.client.filereader import WORKERS, batches, ingest_files
from fabric.client.hardlinks import local_groups, second_names, stored_group
from fabric.errors import BadRequest, Corruption, NotFound
from fabric.format.filetypes import kind_of_mode
from fabric.format.links import names
from fabric.format.model import BLOCKDEV, CHARDEV, DEFAULT_DIR_MODE, DIR, FILE, HOLE_ID, SPECIAL_KINDS, SYMLINK, Commit, Entry
from fabric.format.namespace import visible
from fabric.format.paths import check_path
from fabric.plane.dataplane import DataPlane
from fabric.util.progress import Progress


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

    def describe(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "commit"}
        d["commit_id"] = self.commit.id if self.commit else None
        return d


@dataclass(frozen=True, slots=True)
class LocalItem:
    """What the walk found at one path before any file is read (slots: an import holds one
    per local path until it commits)."""

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


def walk(root: str, prefix: str = "", skipped: list[str] | None = None) -> Iterator[LocalItem]:
    """Files, symlinks, and the directories that need an entry of their own (unordered):
    empty ones, and those whose mode is not :data:`DEFAULT_DIR_MODE`."""
    stack = [(root, prefix)]
    while stack:
        dir_abs, dir_rel = stack.pop()
        try:
            entries = list(os.scandir(dir_abs))
        except PermissionError as exc:
            raise BadRequest(f"cannot read directory {dir_abs!r}: {exc.strerror}") from exc
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
) -> ImportResult:
    """Make ``repo@branch`` (under ``prefix``) equal to directory ``src`` and commit.

    Files whose size, mode and mtime match the branch's entry are not read
    again (``rehash`` reads everything). With ``delete=False`` paths missing
    from ``src`` are kept. Returns a result with ``commit=None`` when nothing
    changed.
    """
    progress = progress or Progress()
    if not os.path.isdir(src):
        raise BadRequest(f"{src!r} is not a directory")
    prefix = normalize_prefix(prefix)
    head = plane.resolve_commit(repo, branch)
    result = ImportResult(None)
    local = {item.path: item for item in walk(os.path.abspath(src), prefix, result.skipped)}
    for path in local:
        check_path(path)
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
            changes[path] = None
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


@dataclass
class ExportResult:
    files: int = 0
    bytes: int = 0
    dirs: int = 0
    symlinks: int = 0
    #: FIFOs, sockets and devices written.
    specials: int = 0
    #: Files and symlinks not written: a directory of the same name shadows them.
    shadowed: list[str] = field(default_factory=list)
    #: Special files not written: devices, without the privilege to make them (CAP_MKNOD).
    skipped: list[str] = field(default_factory=list)


def export_tree(
    plane: DataPlane,
    repo: str,
    ref: str,
    dest: str,
    prefix: str = "",
    progress: Progress | None = None,
) -> ExportResult:
    """Write the files of the commit ``repo@ref`` points at (under ``prefix``) into ``dest``.

    Committed data only: a branch's uncommitted changes are not exported.
    Existing files at the same paths are replaced; other files in ``dest`` are
    left alone. Modes and modification times are restored.

    Nothing is written outside ``dest`` (see :class:`DestDir`): no symlink is
    followed, whether the commit holds it or ``dest`` already did. A file or
    symlink in ``dest`` where the commit has a directory is replaced by a
    directory; a directory in ``dest`` where the commit has a file or symlink is
    a Conflict (export never deletes a directory; what was written before stays).
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

    dirs = {local(p) for p, e in items if e.kind == DIR}
    linked_to = second_names(items)  # hard links: made after their first name is written
    by_dir: dict[str, list[tuple[str, Entry]]] = {}
    for path, entry in items:
        parts = local(path).split("/")
        dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
        if entry.kind != DIR and path not in linked_to:
            by_dir.setdefault("/".join(parts[:-1]), []).append((path, entry))
    progress.start(sum(e.size for p, e in items if e.kind == FILE and p not in linked_to), "B", "export")

    with DestDir(dest) as out:
        for rel in sorted(dirs):  # parents first
            out.make_dir(rel)

        def write(task: tuple[str, list[tuple[str, Entry]]]) -> None:
            parent, batch = task
            with out.directory(parent) as dir_fd:
                for path, entry in batch:
                    if entry.kind == SYMLINK:
                        out.write_symlink(dir_fd, local(path), entry.target, entry.mtime_ns)
                    elif entry.kind in SPECIAL_KINDS:
                        if out.write_special(dir_fd, local(path), entry.kind, entry.mode, entry.rdev, entry.mtime_ns):
                            made.append(path)
                        else:
                            result.skipped.append(path)
                    else:
                        pieces = _advancing(_file_pieces(plane, repo, commit, path, entry), progress)
                        out.write_file(dir_fd, local(path), pieces, entry.mode, entry.mtime_ns)

        tasks = ((parent, batch) for parent, files in by_dir.items() for batch in batches(files, lambda it: it[1].size))
        with ThreadPoolExecutor(WORKERS) as pool:
            for _ in pool.map(write, tasks):
                pass
        for path, first in linked_to.items():
            out.link(local(first), local(path))
        # Deepest first: a directory's time is set after its children changed it, and a
        # read-only mode cannot stop its own children from being written.
        for path, entry in sorted(((p, e) for p, e in items if e.kind == DIR), key=lambda it: it[0].count("/"), reverse=True):
            out.set_dir_attrs(local(path), entry.mode, entry.mtime_ns)
    progress.close()
    for _, entry in items:
        if entry.kind == FILE:
            result.files += 1
            result.bytes += entry.size
        elif entry.kind == DIR:
            result.dirs += 1
        elif entry.kind == SYMLINK:
            result.symlinks += 1
    result.specials = len(made)
    result.skipped.sort()
    return result


def _file_pieces(plane: DataPlane, repo: str, commit: str, path: str, entry: Entry) -> Iterator[bytes | int]:
    """The content of a file to export: its bytes, and for each hole of a sparse file its
    length (an int: :meth:`DestDir.write_file` leaves a hole), whose zeros are never read."""
    chunks = entry.chunks
    if entry.chunklist and "-" in entry.md5:
        # Only a file whose ETag is not the MD5 of its content may have holes (see
        # fabric.format.ingest.sparse_etag): its long chunk list is fetched to find them.
        chunks = plane.stat_chunks(repo, commit, path).chunks
    if all(cid != HOLE_ID for cid, _ in chunks):
        yield from plane.open_file(repo, commit, path, entry)
        return
    pos = 0
    for hole, run in itertools.groupby(chunks, key=lambda c: c[0] == HOLE_ID):
        n = sum(size for _, size in run)
        if hole:
            yield n
        else:
            yield from plane.open_file(repo, commit, path, entry, pos, n)
        pos += n


def _advancing(pieces: Iterator[bytes | int], progress: Progress) -> Iterator[bytes | int]:
    for piece in pieces:
        progress.advance(piece if isinstance(piece, int) else len(piece))
        yield piece
