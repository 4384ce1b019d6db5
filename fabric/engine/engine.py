"""The versioning engine: the hub's implementation of the data-plane operations.

It knows nothing of HTTP, S3 or FUSE (those frontends translate their
protocol into these calls). State lives in two places: immutable objects in
an :class:`~fabric.store.ObjectStore` (packs of chunks, ranges,
metaranges, chunk lists, commits) and mutable refs/staging in the SQL
:class:`~fabric.catalog.Catalog`. Objects are always written before the refs
that reach them.
"""

from __future__ import annotations

import getpass
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import BinaryIO

from fabric.catalog import Catalog, Database
from fabric.catalog.catalog import BRANCH, TAG
from fabric.catalog.pool import DEFAULT_SIZE as DEFAULT_POOL_SIZE
from fabric.engine import maintenance
from fabric.engine.chunkstore import ChunkStore
from fabric.engine.metastore import CHUNKLIST, COMMIT, METARANGE, MetaStore
from fabric.engine.reader import Reader, View, prefix_end
from fabric.engine.refs import parse_ref
from fabric.engine.tree import Trees
from fabric.errors import BadRequest, ChunksMissing, Conflict, MergeConflict, NotFound, ObjectNotFound
from fabric.format.ingest import PackSession, file_entry, ingest_stream
from fabric.format.listing import Change, Listing, change_kind
from fabric.format.model import FILE, INLINE_CHUNKS, Commit, Entry, chunk_list_object, stored_ids
from fabric.format.paths import COMMIT_ID_RE, check_bucket_name, check_path, check_prefix, check_ref_name, check_repo_name
from fabric.plane.dataplane import DataPlane
from fabric.plane.reads import HintedEntries
from fabric.store import ObjectStore, open_store
from fabric.util.progress import Progress
from fabric.util.sqlite import Durability

DEFAULT_BRANCH = "main"
#: The pack store of a data directory unless told otherwise: ``DIR/store``.
DEFAULT_STORE = "store"
#: Chunks and objects younger than this are never garbage collected, so a
#: writer that found a chunk present has this long to commit a reference to it.
DEFAULT_GC_GRACE = 6 * 3600.0
#: Packs of a chunk sink (``fabric import``): while a full pack is stored the session
#: holds it twice (its frames and the pack's bytes), so an import of 100,000 small files
#: peaks about 20 MiB lower than with packs.TARGET_SIZE (32 MiB); as large as a client's uploads.
SINK_PACK_SIZE = 16 * 1024 * 1024
#: Set in the catalog once every repository's chunks are recorded (see ``repo_chunks``).
OWNERSHIP_SETTING = "chunk_ownership"


class CatalogStaging:
    """The :class:`~fabric.engine.reader.Staging` of a branch, read from the catalog."""

    def __init__(self, catalog: Catalog, repo: str, branch: str) -> None:
        self.catalog, self.repo, self.branch = catalog, repo, branch

    def entry(self, path: str) -> tuple[bool, bytes | None]:
        return self.catalog.staged_entry(self.repo, self.branch, path)

    def between(self, start: str, end: str | None) -> Iterator[tuple[str, bytes | None]]:
        return self.catalog.staged(self.repo, self.branch, start, end)


def default_author() -> str:
    try:
        return os.environ.get("FABRIC_AUTHOR") or getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in some containers
        return "fabric"


class Engine(DataPlane):
    def __init__(self, catalog: Catalog, store: ObjectStore, gc_grace: float = DEFAULT_GC_GRACE) -> None:
        self.catalog = catalog
        self.store = store
        self.meta = MetaStore(store)
        self.trees = Trees(self.meta)
        self.chunks = ChunkStore(store, catalog, gc_grace)
        self.reader = Reader(self.meta, self.trees, self.chunks.read_many)
        self.hinted = HintedEntries()  # a job's next epoch hints the same files
        self.meta.put(METARANGE, [])  # the empty tree, which every first commit points at
        self.gc_grace = gc_grace
        if catalog.setting(OWNERSHIP_SETTING) is None:
            # A catalog from before chunks belonged to repositories: record what each
            # repository's refs and staging areas use (once; idempotent if interrupted).
            maintenance.record_ownership(self)
            catalog.set_setting(OWNERSHIP_SETTING, "1")

    @classmethod
    def open(
        cls,
        data_dir: str,
        db_url: str | None = None,
        store_url: str | None = None,
        gc_grace: float | None = None,
        catalog_sync: Durability = "full",
        catalog_pool: int = DEFAULT_POOL_SIZE,
    ) -> Engine:
        """Open (creating if needed) the hub data directory ``data_dir``.

        Defaults: SQLite at ``DIR/catalog.db``, packs under ``DIR/store``. A store
        URL given once is remembered in the catalog and used on later opens.
        ``catalog_sync`` is a SQLite catalog's durability (``full``, or ``normal``:
        faster, the last commits may be lost on power loss); ``catalog_pool`` bounds
        the catalog's open connections.
        """
        os.makedirs(data_dir, exist_ok=True)
        db = Database(db_url or os.path.join(data_dir, "catalog.db"), pool_size=catalog_pool, sync=catalog_sync)
        catalog = Catalog(db)
        recorded = catalog.setting("store_url")
        url = store_url or recorded or DEFAULT_STORE
        if recorded is None:
            catalog.set_setting("store_url", url)
        if url == DEFAULT_STORE:  # relative to the data directory, which may be moved or copied
            url = os.path.join(os.path.abspath(data_dir), DEFAULT_STORE)
        grace = gc_grace if gc_grace is not None else float(os.environ.get("FABRIC_GC_GRACE", DEFAULT_GC_GRACE))
        return cls(catalog, open_store(url), grace)

    def close(self) -> None:
        self.catalog.db.close()

    # -- repositories --------------------------------------------------------
    def create_repo(
        self, name: str, default_branch: str = DEFAULT_BRANCH, owner: str | None = None, author: str | None = None
    ) -> dict:
        check_repo_name(name)
        check_ref_name(default_branch)
        # Write the empty tree again: gc may have removed it since this engine started.
        empty = self.trees.build(iter(()))
        first = self._write_commit(Commit.new(empty, [], author or default_author(), "Repository created"))
        self.catalog.create_repo(name, default_branch, first.id)
        return self.get_repo(name)

    def get_repo(self, name: str) -> dict:
        check_repo_name(name)
        repo, default_branch, created = self.catalog.get_repo(name)
        return {"name": repo, "default_branch": default_branch, "created": created}

    def list_repos(self) -> list[dict]:
        return [{"name": n, "default_branch": b, "created": c} for n, b, c in self.catalog.list_repos()]

    def delete_repo(self, name: str) -> None:
        check_repo_name(name)
        self.catalog.delete_repo(name)

    # -- refs ----------------------------------------------------------------
    def resolve(self, repo: str, ref: str) -> View:
        """Resolve a ref expression to what a read sees."""
        self.get_repo(repo)
        expr = parse_ref(ref)
        row = self.catalog.get_ref(repo, BRANCH, expr.base)
        if row is not None:
            commit_id = row.commit_id
            branch = expr.base if expr.plain else None
        else:
            branch = None
            tag = self.catalog.get_ref(repo, TAG, expr.base)
            commit_id = tag.commit_id if tag else self._commit_by_id(repo, expr.base)
        for _ in range(expr.ancestors):
            parents = self.get_commit(repo, commit_id).parents
            if not parents:
                raise NotFound(f"{ref!r} goes back past the first commit of {repo!r}")
            commit_id = parents[0]
        commit = self.get_commit(repo, commit_id)
        staging = CatalogStaging(self.catalog, repo, branch) if branch else None
        return View(repo, commit_id, commit.tree, branch, staging)

    def resolve_commit(self, repo: str, ref: str) -> str:
        return self.resolve(repo, ref).commit_id

    def _commit_by_id(self, repo: str, text: str) -> str:
        if not COMMIT_ID_RE.match(text):
            raise NotFound(f"no branch, tag or commit {text!r} in repository {repo!r}")
        found = self.catalog.commits_with_prefix(repo, text)
        if not found:
            raise NotFound(f"no branch, tag or commit {text!r} in repository {repo!r}")
        if len(found) > 1:
            raise BadRequest(f"commit prefix {text!r} is ambiguous in {repo!r}; give more characters")
        return found[0]

    def head(self, repo: str, branch: str) -> str:
        check_ref_name(branch)
        row = self.catalog.get_ref(repo, BRANCH, branch)
        if row is None:
            self.get_repo(repo)
            raise NotFound(f"branch {branch!r} does not exist in repository {repo!r}")
        return row.commit_id

    def list_branches(self, repo: str) -> list[dict]:
        self.get_repo(repo)
        return [{"name": r.name, "commit_id": r.commit_id} for r in self.catalog.list_refs(repo, BRANCH)]

    def create_branch(self, repo: str, name: str, source: str) -> dict:
        check_ref_name(name)
        view = self.resolve(repo, source)
        if self.catalog.get_ref(repo, TAG, name):
            raise Conflict(f"a tag named {name!r} exists in {repo!r}; branch and tag names must differ")
        self.catalog.create_ref(repo, BRANCH, name, view.commit_id)
        return {"name": name, "commit_id": view.commit_id}

    def delete_branch(self, repo: str, name: str) -> None:
        if name == self.get_repo(repo)["default_branch"]:
            raise BadRequest(f"cannot delete {name!r}: it is the default branch of {repo!r}")
        self.catalog.delete_ref(repo, BRANCH, name)

    def reset_branch(self, repo: str, name: str, ref: str) -> dict:
        """Point a branch at ``ref`` and discard its uncommitted changes."""
        target = self.resolve(repo, ref).commit_id
        self.catalog.move_branch(repo, name, self.head(repo, name), target, clear_staging=True)
        return {"name": name, "commit_id": target}

    def list_tags(self, repo: str) -> list[dict]:
        self.get_repo(repo)
        return [{"name": r.name, "commit_id": r.commit_id} for r in self.catalog.list_refs(repo, TAG)]

    def create_tag(self, repo: str, name: str, ref: str) -> dict:
        check_ref_name(name, "tag")
        view = self.resolve(repo, ref)
        if self.catalog.get_ref(repo, BRANCH, name):
            raise Conflict(f"a branch named {name!r} exists in {repo!r}; branch and tag names must differ")
        self.catalog.create_ref(repo, TAG, name, view.commit_id)
        return {"name": name, "commit_id": view.commit_id}

    def delete_tag(self, repo: str, name: str) -> None:
        self.get_repo(repo)
        self.catalog.delete_ref(repo, TAG, name)

    # -- commits -------------------------------------------------------------
    def get_commit(self, repo: str, commit_id: str) -> Commit:
        return self.reader.get_commit(commit_id)

    def _write_commit(self, commit: Commit) -> Commit:
        cid = self.meta.put(COMMIT, commit.to_wire())
        return Commit.from_wire(commit.to_wire(), cid)

    def commit(
        self,
        repo: str,
        branch: str,
        message: str,
        author: str | None = None,
        meta: Mapping[str, str] | None = None,
        expected_head: str | None = None,
        allow_empty: bool = False,
    ) -> Commit:
        """Fold a branch's staging area into a new commit (compare-and-swap on the head)."""
        row = self.catalog.get_ref(repo, BRANCH, branch)
        if row is None:
            self.get_repo(repo)
            raise NotFound(f"branch {branch!r} does not exist in repository {repo!r}")
        if expected_head is not None and row.commit_id != expected_head:
            raise Conflict(
                f"branch {branch!r} is at {row.commit_id[:12]}, not the expected {expected_head[:12]}",
                head=row.commit_id,
            )
        staged = {
            path: Entry.decode(enc) if enc is not None else None
            for path, enc in self.catalog.staged(repo, branch, max_seq=row.staging_seq)
        }
        return self._commit_onto(repo, branch, row.commit_id, staged, message, author, meta, allow_empty, row.staging_seq)

    def commit_changes(
        self,
        repo: str,
        branch: str,
        changes: Mapping[str, Entry | None],
        message: str,
        author: str | None = None,
        meta: Mapping[str, str] | None = None,
        expected_head: str | None = None,
        allow_empty: bool = False,
    ) -> Commit:
        """Commit explicit changes onto a branch head, leaving its staging area alone."""
        head = self.head(repo, branch)
        if expected_head is not None and head != expected_head:
            # Checked before anything else, so a stale head is a conflict, not "nothing to commit".
            raise Conflict(f"branch {branch!r} is at {head[:12]}, not the expected {expected_head[:12]}", head=head)
        return self._commit_onto(repo, branch, head, changes, message, author, meta, allow_empty, None)

    def _commit_onto(
        self,
        repo: str,
        branch: str,
        head: str,
        changes: Mapping[str, Entry | None],
        message: str,
        author: str | None,
        meta: Mapping[str, str] | None,
        allow_empty: bool,
        fold_seq: int | None,
        extra_parents: tuple[str, ...] = (),
    ) -> Commit:
        if not message or not message.strip():
            raise BadRequest("a commit needs a message (-m MESSAGE)")
        for path in changes:
            check_path(path)
        parent = self.get_commit(repo, head)
        self._require_chunks(repo, changes.values())
        tree = self.trees.apply(parent.tree, self._normalized(changes))
        if tree == parent.tree and not allow_empty and not extra_parents:
            current = self.head(repo, branch)
            if current != head:  # a concurrent commit took the staged changes first
                raise Conflict(f"branch {branch!r} moved to {current[:12]} while committing; retry", head=current)
            raise BadRequest(f"nothing to commit on {repo}@{branch}: no changes since {head[:12]}")
        commit = self._write_commit(
            Commit.new(tree, [head, *extra_parents], author or default_author(), message, dict(meta or {}))
        )
        self.catalog.move_branch(repo, branch, head, commit.id, fold_seq=fold_seq)
        return commit

    def _require_chunks(self, repo: str, entries: Iterable[Entry | None]) -> None:
        """Refuse entries whose chunks are not stored as chunks of ``repo`` (holes are stored nowhere)."""
        ids: list[bytes] = []
        for entry in entries:
            if entry is not None and (entry.chunks or entry.chunklist):  # (of any kind: a FIFO naming chunks too)
                ids.extend(stored_ids(self.reader.chunk_list(entry)))
        unchecked = self.chunks.unclaimed(repo, ids)  # (less what this process's sinks just made the repository's)
        if unchecked:
            lacking = self.chunks.missing(unchecked, owner=repo)
            if lacking:
                raise ChunksMissing(
                    f"{len(lacking)} chunk(s) referenced by the change are not stored for repository {repo!r} "
                    f"(first {lacking[0].hex()}); upload them first",
                    (cid.hex() for cid in lacking),
                )

    def _require_owned(self, repo: str, ids: Sequence[bytes]) -> None:
        owned = self.catalog.owned_chunks(repo, ids)
        foreign = [cid for cid in ids if cid not in owned]
        if foreign:
            # The same answer whether the chunk belongs to another repository or to none.
            raise NotFound(f"chunk {foreign[0].hex()} is not in repository {repo!r} ({len(foreign)} such)")

    def log(self, repo: str, ref: str, path: str | None = None, limit: int = 100, after: str | None = None) -> list[Commit]:
        """Commits reachable from ``ref``, newest first; ``path`` keeps those that changed it.

        ``after``: a commit id from a previous page; the page starts after it.
        """
        if path:
            check_path(path.rstrip("/"))
        return self.reader.log(self.resolve(repo, ref).commit_id, path, limit, after)

    # -- diff / merge / revert -----------------------------------------------
    def diff(self, repo: str, left: str, right: str, prefix: str = "", after: str = "") -> Iterator[Change]:
        """See :meth:`DataPlane.diff`; ``after`` resumes after that path, reading only
        what lies beyond it (a page of a long diff costs about one page of work)."""
        check_prefix(prefix)
        ltree = self.resolve(repo, left).tree
        rtree = self.resolve(repo, right).tree
        for path, a, b in self.trees.diff(ltree, rtree, prefix, after):
            yield Change(path, change_kind(a, b), a, b)

    def uncommitted(self, repo: str, branch: str, prefix: str = "", after: str = "") -> Iterator[Change]:
        """See :meth:`DataPlane.uncommitted`; ``after`` resumes after that path."""
        check_prefix(prefix)
        view = self.resolve(repo, branch)
        if view.branch is None:
            raise BadRequest(f"{branch!r} is not a branch of {repo!r}; only branches have uncommitted changes")
        for path, enc in self.catalog.staged(repo, branch, prefix, prefix_end(prefix), after=after):
            new = Entry.decode(enc) if enc is not None else None
            old = self.trees.get(view.tree, path)
            if new is None and old is None:
                continue
            yield Change(path, change_kind(old, new), old, new)

    def merge_base(self, repo: str, a: str, b: str) -> str | None:
        return self.reader.merge_base(a, b)

    def merge(
        self,
        repo: str,
        source: str,
        dest: str,
        strategy: str | None = None,
        message: str | None = None,
        author: str | None = None,
    ) -> Commit:
        """Three-way merge of ``source`` into branch ``dest`` at file granularity.

        A path changed differently on both sides is a conflict; ``strategy``
        ``ours`` keeps the destination's version, ``theirs`` the source's.
        """
        if strategy not in (None, "ours", "theirs"):
            raise BadRequest(f"unknown merge strategy {strategy!r}: use 'ours' or 'theirs'")
        src = self.resolve(repo, source)
        head = self.head(repo, dest)
        dst_tree = self.get_commit(repo, head).tree
        base = self.merge_base(repo, src.commit_id, head)
        if base == src.commit_id:
            raise BadRequest(f"nothing to merge: {source!r} is already merged into {dest!r}")
        base_tree = self.get_commit(repo, base).tree if base else self.trees.empty
        theirs = {p: b for p, _, b in self.trees.diff(base_tree, src.tree)}
        ours = {p: b for p, _, b in self.trees.diff(base_tree, dst_tree)}
        changes: dict[str, Entry | None] = {}
        conflicts = []
        for path, entry in theirs.items():
            if path in ours and not _same(ours[path], entry):
                if strategy == "ours":
                    continue
                if strategy is None:
                    conflicts.append(path)
                    continue
            changes[path] = entry
        if conflicts:
            raise MergeConflict(
                f"merge of {source!r} into {dest!r} conflicts on {len(conflicts)} path(s); "
                "resolve them or retry with --strategy ours|theirs",
                conflicts,
            )
        msg = message or f"Merge {source} into {dest}"
        return self._commit_onto(repo, dest, head, changes, msg, author, {}, True, None, (src.commit_id,))

    def revert(self, repo: str, branch: str, commit_ref: str, parent: int = 1, author: str | None = None) -> Commit:
        """Undo the changes of one commit on a branch (conflict if those paths changed since)."""
        target_id = self.resolve(repo, commit_ref).commit_id
        target = self.get_commit(repo, target_id)
        if not target.parents:
            raise BadRequest("cannot revert the first commit of a repository")
        if not 1 <= parent <= len(target.parents):
            raise BadRequest(f"commit {target_id[:12]} has {len(target.parents)} parent(s); --parent {parent} is out of range")
        head = self.head(repo, branch)
        head_tree = self.get_commit(repo, head).tree
        parent_tree = self.get_commit(repo, target.parents[parent - 1]).tree
        changes: dict[str, Entry | None] = {}
        conflicts = []
        for path, before, after in self.trees.diff(parent_tree, target.tree):
            if not _same(self.trees.get(head_tree, path), after):
                conflicts.append(path)
            changes[path] = before
        if conflicts:
            raise MergeConflict(f"cannot revert {target_id[:12]}: {len(conflicts)} path(s) changed since", conflicts)
        return self._commit_onto(
            repo, branch, head, changes, f"Revert {target_id[:12]}: {target.message}", author, {}, False, None
        )

    # -- objects: reading ----------------------------------------------------
    def stat(self, repo: str, ref: str, path: str) -> Entry:
        check_path(path)
        view = self.resolve(repo, ref)
        entry = self.reader.stat(view, path)
        if entry is None:
            raise NotFound(f"{path!r} not found in {repo}@{ref}")
        return entry

    def stat_chunks(self, repo: str, ref: str, path: str) -> Entry:
        entry = self.stat(repo, ref, path)
        if entry.chunklist:
            return entry.with_(chunks=self.reader.chunk_list(entry), chunklist=None)
        return entry

    def hint(self, repo: str, ref: str, paths: Sequence[str], job: str, append: bool = False, top_up: bool = False) -> dict:
        """Checked only (a hub fetches nothing ahead), against one view of ``ref``."""
        view = self.resolve(repo, ref)
        entries = self.hinted.check(repo, ref, paths, job, lambda path: self.reader.stat(view, path), view.fixed_tree)
        return {"job": job, "paths": len(paths), "bytes": sum(entries[p].size for p in paths), "window_bytes": 0}

    def list(
        self,
        repo: str,
        ref: str,
        prefix: str = "",
        delimiter: str = "",
        after: str = "",
        limit: int = 1000,
    ) -> Listing:
        """List paths under ``prefix``; with ``delimiter`` group deeper paths into prefixes (S3 style)."""
        check_prefix(prefix)
        if delimiter not in ("", "/"):
            raise BadRequest("only '/' is supported as a delimiter")
        if limit < 1:
            raise BadRequest("limit must be at least 1")
        if "\x00" in after:
            raise BadRequest(f"invalid start-after {after!r}: contains a NUL byte")
        return self.reader.list_view(self.resolve(repo, ref), prefix, delimiter, after, limit)

    def read_stream(self, repo: str, ref: str, path: str, offset: int = 0, length: int | None = None) -> Iterator[bytes]:
        entry = self.stat(repo, ref, path)
        if entry.kind != FILE:
            raise BadRequest(f"{path!r} in {repo}@{ref} is a {entry.kind}, not a file")
        return self.reader.read_entry(entry, offset, length)

    def open_file(
        self, repo: str, ref: str, path: str, entry: Entry | None = None, offset: int = 0, length: int | None = None
    ) -> Iterator[bytes]:
        if entry is not None and entry.kind == FILE:
            return self.reader.read_entry(entry, offset, length)
        return self.read_stream(repo, ref, path, offset, length)

    # -- objects: writing ----------------------------------------------------
    def normalize(self, entry: Entry | None) -> Entry | None:
        """Move a long inline chunk list into its own object (entries as stored)."""
        if entry is None or entry.kind != FILE or len(entry.chunks) <= INLINE_CHUNKS:
            return entry
        return entry.with_(chunks=(), chunklist=self.meta.put(CHUNKLIST, chunk_list_object(entry.chunks)))

    def put_object(
        self,
        repo: str,
        branch: str,
        path: str,
        stream: BinaryIO,
        mode: int = 0o644,
        mtime_ns: int | None = None,
        meta: Mapping[str, str] | None = None,
        durability: str | None = None,
    ) -> Entry:
        """Store a stream as a file on a branch (staged; visible to branch reads at once).

        The hub stores before it returns: every durability level is met."""
        check_path(path)
        self.head(repo, branch)
        with self.chunks.session(owner=repo) as session:
            chunks, md5 = ingest_stream(stream, session)
        entry = self.normalize(file_entry(chunks, md5, mode, mtime_ns if mtime_ns is not None else time.time_ns(), meta))
        # (the session made every chunk the repository's: nothing left to check before staging)
        self.catalog.stage(repo, branch, [(path, entry.encode())])
        return entry

    def stage(self, repo: str, branch: str, changes: Mapping[str, Entry | None], durability: str | None = None) -> int:
        """Stage entries (``None`` deletes) whose chunks are already stored (hub-durable)."""
        return self.catalog.stage(repo, branch, self._staging_rows(repo, changes))

    def stage_if(
        self,
        repo: str,
        branch: str,
        changes: Mapping[str, Entry | None],
        check: Callable[[], None],
        durability: str | None = None,
    ) -> int:
        """Stage ``changes`` if ``check()`` passes, in one catalog transaction that holds the
        branch's ref row: no other stage or commit of the branch, in any hub process, comes
        between the check and the write.

        ``check`` runs once before the transaction too: a failing condition takes no lock,
        and the tree objects it reads (from the object store) are cached before the row is
        locked, so that other writers of the branch (every writer, on SQLite) do not wait on
        that I/O. It must only read."""
        rows = self._staging_rows(repo, changes)
        check()
        return self.catalog.stage(repo, branch, rows, check=check)

    def _staging_rows(self, repo: str, changes: Mapping[str, Entry | None]) -> list[tuple[str, bytes | None]]:
        """``changes`` as staging rows, once every path is valid and every chunk is the repository's."""
        for path in changes:
            check_path(path)
        self._require_chunks(repo, changes.values())
        return [(p, e.encode() if e is not None else None) for p, e in self._normalized(changes).items()]

    def stage_unless_newer(
        self, repo: str, branch: str, changes: Mapping[str, Entry | None], since_seq: int, since_head: str
    ) -> tuple[int, list[str]]:
        """Stage ``changes`` except the paths written on the branch since the caller first
        tried (its staging seq was ``since_seq`` and its head ``since_head`` then): a replay
        of a write that may have landed never overwrites a newer one. Returns the staging
        seq and the paths left out (staged since, or changed by a commit since)."""
        rows = self._staging_rows(repo, changes)
        head = self.head(repo, branch)
        committed = set()
        if head != since_head:
            try:
                before = self.get_commit(repo, self._commit_by_id(repo, since_head)).tree
            except (NotFound, BadRequest):  # not a commit of this repository: treat every path as changed
                before = None
            after = self.get_commit(repo, head).tree
            for path in changes:
                was = self.trees.get(before, path) if before is not None else None
                now = self.trees.get(after, path)
                if before is None or (was.encode() if was else None) != (now.encode() if now else None):
                    committed.add(path)
        rows = [row for row in rows if row[0] not in committed]
        seq, newer = self.catalog.stage_unless_newer(repo, branch, rows, since_seq, head)
        return seq, sorted(committed.union(newer))

    def _normalized(self, changes: Mapping[str, Entry | None]) -> dict[str, Entry | None]:
        return {path: self.normalize(entry) for path, entry in changes.items()}

    def delete_object(self, repo: str, branch: str, path: str, durability: str | None = None) -> None:
        check_path(path)
        view = self.resolve(repo, branch)
        if view.branch is None:
            raise BadRequest(f"{branch!r} is not a branch; objects can only be deleted on a branch")
        if self.reader.stat(view, path) is None:
            raise NotFound(f"{path!r} not found in {repo}@{branch}")
        self.catalog.stage(repo, branch, [(path, None)])

    def discard(self, repo: str, branch: str) -> None:
        head = self.head(repo, branch)
        # A reset onto its own head: one transaction, and an event that tells caches.
        self.catalog.move_branch(repo, branch, head, head, clear_staging=True)

    # -- chunk exchange ------------------------------------------------------
    # The hub's store is every durability level at once.
    def missing_chunks(
        self, ids: Sequence[bytes], durability: str | None = None, repo: str | None = None
    ) -> list[bytes]:
        if repo is not None:
            self.get_repo(repo)
        return self.chunks.missing(ids, owner=repo)

    def receive_pack(self, data: bytes, durability: str | None = None, repo: str | None = None) -> tuple[int, int]:
        if repo is not None:
            self.get_repo(repo)
        return self.chunks.receive_pack(data, owner=repo)

    def frames(self, ids: Sequence[bytes], repo: str | None = None) -> Iterator[tuple[bytes, bytes]]:
        if repo is not None:
            self.get_repo(repo)
            self._require_owned(repo, ids)
        return self.chunks.frames(ids)

    def share_chunks(self, source_repo: str, repo: str, ids: Sequence[bytes]) -> None:
        self.get_repo(repo)
        self.get_repo(source_repo)
        self._require_owned(source_repo, ids)
        self.catalog.add_owned_chunks(repo, ids)

    def get_objects(self, ids: Sequence[str]) -> dict[str, bytes]:
        out = {}
        for oid in ids:
            try:
                out[oid] = self.meta.raw(oid)
            except ObjectNotFound:
                continue
        return out

    def staging_snapshot(
        self, repo: str, branch: str, since_seq: int = 0
    ) -> tuple[str, int, list[tuple[str, bytes | None]]]:
        row = self.catalog.get_ref(repo, BRANCH, check_ref_name(branch))
        if row is None:
            self.get_repo(repo)
            raise NotFound(f"branch {branch!r} does not exist in repository {repo!r}")
        rows = self.catalog.staged(repo, branch, max_seq=row.staging_seq, min_seq=since_seq)
        return row.commit_id, row.staging_seq, list(rows)

    def chunk_sink(self, repo: str | None = None) -> PackSession:
        return self.chunks.session(SINK_PACK_SIZE, owner=repo)

    # -- administration ------------------------------------------------------
    def fsck(self, deep: bool = True, progress: Progress | None = None) -> dict:
        return maintenance.fsck(self, deep, progress).describe()

    def gc(self, grace: float | None = None, dry_run: bool = False, progress: Progress | None = None) -> dict:
        return maintenance.gc(self, grace, dry_run, progress).describe()

    def stats(self) -> dict:
        s = self.catalog.stats()
        logical = 0
        for repo, commit_id in self.catalog.all_ref_commits():
            tree = self.get_commit(repo, commit_id).tree
            logical += sum(Entry.decode(enc).size for _, enc in self.trees.iter_raw(tree))
        return {
            "repositories": len(self.catalog.list_repos()),
            "logical_bytes": logical,
            "stored_bytes": s["pack_bytes"],
            **s,
        }

    # -- S3 bucket bindings ----------------------------------------------------
    def _bucket_dict(self, row: tuple) -> dict:
        name, repo, ref, by_s3, created = row
        return {"name": name, "repo": repo, "ref": ref, "created_by_s3": by_s3, "created": created}

    def list_buckets(self) -> list[dict]:
        repos = {name for name, _, _ in self.catalog.list_repos()}
        return [self._bucket_dict(r) for r in self.catalog.list_buckets() if r[1] in repos]

    def get_bucket(self, name: str) -> dict:
        row = self.catalog.get_bucket(name)
        if row is None:
            raise NotFound(f"bucket {name!r} does not exist (see `fabric bucket list`)")
        try:
            self.catalog.get_repo(row[1])
        except NotFound:
            # The repository was deleted: the binding went with it.
            try:
                self.catalog.delete_bucket(name)
            except NotFound:
                pass
            raise NotFound(f"bucket {name!r} does not exist (its repository {row[1]!r} was deleted)") from None
        return self._bucket_dict(row)

    def create_bucket(
        self, name: str, repo: str, ref: str, created_by_s3: bool = False, owner: str | None = None
    ) -> dict:
        """Bind bucket ``name`` to branch or tag ``ref`` of ``repo`` (plain keys over S3)."""
        check_bucket_name(name)
        self.get_repo(repo)
        if name != repo:
            try:
                self.catalog.get_repo(name)
                raise Conflict(f"bucket name {name!r} is taken by a repository; choose another name")
            except NotFound:
                pass
        if self.catalog.get_ref(repo, BRANCH, ref) is None and self.catalog.get_ref(repo, TAG, ref) is None:
            raise NotFound(f"{ref!r} is not a branch or tag of repository {repo!r}; a bucket binds to one of those")
        stale = self.catalog.get_bucket(name)
        if stale is not None and stale[1] != repo:
            try:
                self.catalog.get_repo(stale[1])
            except NotFound:
                self.catalog.delete_bucket(name)
        self.catalog.create_bucket(name, repo, ref, created_by_s3)
        return self.get_bucket(name)

    def delete_bucket(self, name: str) -> None:
        self.catalog.delete_bucket(name)


def _same(a: Entry | None, b: Entry | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.encode() == b.encode()
