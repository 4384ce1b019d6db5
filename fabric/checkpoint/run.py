"""``Checkpoints``: the checkpoints of one run in one repository, and how a save becomes one.

A save is three moves on the run's branch: :meth:`Checkpoints.begin` points the branch at
the run's base (the repository's first, empty commit) and drops what a save that died left
staged; the format writes the step's files, staged on the branch; :meth:`Checkpoints.finish`
commits them (compare-and-swap against the base) and tags the commit ``BRANCH.step-N``. Only
the tag makes a step complete: :meth:`list` and :meth:`latest` read tags alone.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fabric import errors
from fabric.checkpoint.retention import Retention
from fabric.format import checkpoint_names as names
from fabric.format.paths import check_repo_name
from fabric.fsspec import FabricFileSystem
from fabric.fsspec.errors import fs_errors

log = logging.getLogger(__name__)

#: Commits of the default branch read per request while looking for the repository's first.
LOG_PAGE = 1000


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint: its step, the commit holding it and the tag marking it complete."""

    repo: str
    step: int
    commit: str
    tag: str

    @property
    def path(self) -> str:
        """Its directory as a ``fabric://`` path, pinned to the commit (retention cannot pull
        it from under a reader that holds it)."""
        return f"{self.repo}@{self.commit}/{names.step_dir(self.step)}"

    @property
    def url(self) -> str:
        return "fabric://" + self.path


class Checkpoints:
    """The checkpoints of run ``run`` in repository ``repo`` of the hub or spoke at ``server``
    (default ``$FABRIC_SERVER``, token ``$FABRIC_TOKEN``). ``branch`` replaces the run's
    branch ``ckpt.RUN``; ``retention`` is applied after every save (None: keep everything);
    ``create_repo`` lets the first save create a missing repository; ``copies``: a directory
    on this machine's disk where the files of 1 MiB or more a save writes leave plain copies,
    which a load on this machine reads at the local disk's speed (``fabric://``'s ``copies=``,
    default ``$FABRIC_COPIES``); ``durability``: how stored each file a save writes through a
    spoke must be before the save goes on (``local``, ``replicated``, ``hub``; ``fabric://``'s
    ``durability=``, default ``$FABRIC_DURABILITY``, else the spoke's own default)."""

    def __init__(
        self,
        repo: str,
        run: str = "default",
        *,
        branch: str | None = None,
        server: str | None = None,
        token: str | None = None,
        retention: Retention | None = None,
        create_repo: bool = True,
        copies: str | None = None,
        durability: str | None = None,
    ) -> None:
        try:
            self.repo = check_repo_name(repo)
        except errors.InvalidName as exc:
            raise ValueError(exc.message) from None
        self.branch = names.run_branch(run, branch)
        if retention is not None and not isinstance(retention, Retention):
            raise TypeError(f"retention must be a Retention, not {type(retention).__name__}")
        self.retention = retention
        self.create_repo = create_repo
        token = token if token is not None else os.environ.get("FABRIC_TOKEN")
        #: What ``fabric://`` needs to reach the server: DCP's readers and writers get it too.
        self.storage_options: dict[str, Any] = {"server": server or os.environ.get("FABRIC_SERVER"), "token": token,
                                                "copies": copies, "durability": durability}
        self.fs = FabricFileSystem(**self.storage_options, skip_instance_cache=True)
        self.plane = self.fs.plane

    # -- reading -------------------------------------------------------------------
    def list(self) -> list[Checkpoint]:
        """The run's complete checkpoints, oldest step first (one request); FileNotFoundError if
        the repository does not exist, unless the first save may create it (then none)."""
        return self._checkpoints(self._tags())

    def latest(self) -> Checkpoint | None:
        """The complete checkpoint of the highest step, or None (one request)."""
        found = self.list()
        return found[-1] if found else None

    def get(self, step: int | None = None) -> Checkpoint:
        """The complete checkpoint of ``step`` (None: the latest); FileNotFoundError if there is none."""
        found = self.list()
        if step is None:
            if not found:
                raise FileNotFoundError(f"{self.repo}: run branch {self.branch} has no complete checkpoint")
            return found[-1]
        names.check_step(step)
        for ckpt in found:
            if ckpt.step == step:
                return ckpt
        raise FileNotFoundError(f"{self.repo}: no complete checkpoint of step {step} on {self.branch}")

    def load(self, step: int | None = None, state_dict: Any = None) -> Any:
        """The checkpoint of ``step`` (None: the latest). A DCP checkpoint is loaded into
        ``state_dict`` in place (required: DCP loads into the tensors it is given) and
        returned; a files checkpoint is returned as ``{name: bytes}`` (``state_dict``, if given,
        is updated with it)."""
        ckpt = self.get(step)
        with fs_errors(ckpt.path):
            fmt = self.plane.get_commit(self.repo, ckpt.commit).meta.get(names.FORMAT_META, names.FILES)
        if fmt == names.DCP:
            if state_dict is None:
                raise ValueError(f"step {ckpt.step} is a DCP checkpoint: pass the state_dict to load into")
            from fabric.checkpoint import dcp

            return dcp.load(self, ckpt, state_dict)
        from fabric.checkpoint import files

        loaded = files.load(self, ckpt)
        if state_dict is None:
            return loaded
        state_dict.update(loaded)
        return state_dict

    # -- saving --------------------------------------------------------------------
    def save(self, state_dict: Mapping[str, Any], step: int, *, overwrite: bool = False, **options: Any) -> Checkpoint:
        """Save ``state_dict`` as step ``step``; its checkpoint once complete.

        A mapping of names to bytes is stored as one file per name (no torch needed);
        anything else goes through torch Distributed Checkpoint (``options`` go to its
        writer, e.g. ``thread_count``), on every rank of the process group when one is
        initialized (rank 0 starts and finishes the save; every rank gets the checkpoint).
        FileExistsError if the step is complete already, unless ``overwrite``."""
        from fabric.checkpoint import files

        if files.is_files(state_dict):
            if options:
                raise TypeError(f"options {sorted(options)} apply to DCP saves only")
            return files.save(self, state_dict, step, overwrite)
        from fabric.checkpoint import dcp

        return dcp.save(self, state_dict, step, overwrite, **options)

    def step_url(self, step: int) -> str:
        """Where a save of ``step`` stages its files: the step's directory on the run's branch."""
        return f"fabric://{self.repo}@{self.branch}/{names.step_dir(step)}"

    def begin(self, step: int, overwrite: bool = False) -> str:
        """Make the run's branch ready for a save of ``step``; the base commit to pass to
        :meth:`finish`. Creates the repository (with ``create_repo``) and branch if missing,
        and drops whatever an unfinished save left staged: a save is never resumed (its
        chunks are still at the hub, so writing them again sends only their ids)."""
        names.check_step(step)
        if not overwrite and any(c.step == step for c in self.list()):
            raise FileExistsError(f"{self.repo}: step {step} of {self.branch} is saved already (pass overwrite=True)")
        with fs_errors(f"{self.repo}@{self.branch}"):
            self._ensure_branch()
            base = self._base()
            self.plane.reset_branch(self.repo, self.branch, base)
        return base

    def finish(self, step: int, base: str, fmt: str, overwrite: bool = False) -> Checkpoint:
        """Commit what is staged for ``step`` and tag it: from here on the step is complete.
        Then apply the retention policy (a failure there is logged: the save stands)."""
        tag = names.step_tag(self.branch, step)
        meta = {names.STEP_META: str(step), names.FORMAT_META: fmt}
        with fs_errors(f"{self.repo}@{self.branch}"):
            try:
                commit = self.plane.commit(self.repo, self.branch, f"checkpoint step {step}", meta=meta, expected_head=base)
            except errors.Conflict:
                raise RuntimeError(
                    f"{self.repo}@{self.branch} moved during the save of step {step}: another writer saves to this run"
                ) from None
            if overwrite:
                try:
                    self.plane.delete_tag(self.repo, tag)
                except errors.NotFound:
                    pass
            self.plane.create_tag(self.repo, tag, commit.id)
        ckpt = Checkpoint(self.repo, step, commit.id, tag)
        if self.retention is not None:
            try:
                self.prune()
            except Exception:  # noqa: BLE001 - the checkpoint is complete; the next save prunes again
                log.warning("checkpoint %s: retention failed; the next save tries again", tag, exc_info=True)
        return ckpt

    # -- retention -----------------------------------------------------------------
    def prune(self, retention: Retention | None = None) -> list[Checkpoint]:
        """Drop the checkpoints ``retention`` (default: the run's) does not keep: their tags are
        deleted, so the next ``fabric gc`` frees the chunks no kept checkpoint shares. Returns
        the dropped checkpoints."""
        retention = retention or self.retention
        if retention is None:
            raise ValueError("prune needs a retention policy")
        tags = self._tags()
        found = self._checkpoints(tags)
        ours = {c.tag for c in found}
        by_hand = {t["commit_id"] for t in tags if t["name"] not in ours}
        kept = retention.kept([c.step for c in found], [c.step for c in found if c.commit in by_hand])
        dropped = [c for c in found if c.step not in kept]
        with fs_errors(self.repo):
            for ckpt in dropped:
                try:
                    self.plane.delete_tag(self.repo, ckpt.tag)
                except errors.NotFound:  # pruned by another process meanwhile
                    pass
        return dropped

    # -- helpers -------------------------------------------------------------------
    def _tags(self) -> list[dict]:
        """The repository's tags; none while it does not exist and the first save may create it."""
        with fs_errors(self.repo):
            try:
                return self.plane.list_tags(self.repo)
            except errors.NotFound:
                if self.create_repo:
                    return []
                raise

    def _checkpoints(self, tags: list[dict]) -> list[Checkpoint]:
        found = []
        for t in tags:
            step = names.tag_step(self.branch, t["name"])
            if step is not None:
                found.append(Checkpoint(self.repo, step, t["commit_id"], t["name"]))
        return sorted(found, key=lambda c: c.step)

    def _ensure_branch(self) -> None:
        try:
            branches = {b["name"] for b in self.plane.list_branches(self.repo)}
        except errors.NotFound:
            if not self.create_repo:
                raise
            try:
                self.plane.create_repo(self.repo)
            except errors.Conflict:  # created by another process meanwhile
                pass
            branches = {b["name"] for b in self.plane.list_branches(self.repo)}
        if self.branch not in branches:
            try:
                self.plane.create_branch(self.repo, self.branch, self._root())
            except errors.Conflict:  # created by another process meanwhile
                pass

    def _root(self) -> str:
        """The repository's first commit (made with it, empty): the base of every save."""
        default = self.plane.get_repo(self.repo)["default_branch"]
        after = None
        while True:
            page = self.plane.log(self.repo, default, limit=LOG_PAGE, after=after)
            for commit in page:
                if not commit.parents:
                    return commit.id
            if len(page) < LOG_PAGE:
                raise errors.NotFound(f"{self.repo}: no first commit found on {default}")
            after = page[-1].id

    def _base(self) -> str:
        """The commit saves start from: the branch's head, or its parent when the head is a
        checkpoint commit (the last save, finished or not yet tagged)."""
        head = self.plane.resolve_commit(self.repo, self.branch)
        commit = self.plane.get_commit(self.repo, head)
        return commit.parents[0] if names.STEP_META in commit.meta and commit.parents else head
