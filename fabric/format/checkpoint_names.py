"""Names of a checkpoint run's refs (:mod:`fabric.checkpoint`): its branch (``ckpt.RUN``) and
one tag per complete step (``BRANCH.step-N``), and the directory a step's files lie in
(``step-N/``). Here, below both the helper and the CLI, which lists checkpoints too."""

from __future__ import annotations

import re

from fabric.format.paths import check_ref_name

_RUN_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,99}$")
_STEP_MARK = ".step-"
#: Commit metadata of a checkpoint commit: its step and how its files were written.
STEP_META = "fabric.checkpoint.step"
FORMAT_META = "fabric.checkpoint.format"
#: ... and, for a save through a mount (``--commit-checkpoints``), the directory it is in.
DIR_META = "fabric.checkpoint.dir"
#: The formats a step is written in: one file per name, or torch Distributed Checkpoint.
FILES = "files"
DCP = "dcp"
#: Steps are non-negative integers below this bound (they go into ref names).
MAX_STEP = 10**18


def run_branch(run: str, branch: str | None) -> str:
    """The branch a run stages its saves on: ``branch`` if given, else ``ckpt.RUN``.

    ValueError for a run name other than 1-100 of ``A-Z a-z 0-9 _ -``, or a branch that is
    not a valid branch name or holds ``.step-`` (it would be ambiguous with the tags)."""
    if branch is None:
        if not isinstance(run, str) or not _RUN_RE.match(run):
            raise ValueError(f"invalid run name {run!r}: use 1-100 letters, digits, '_' or '-', not starting with '-'")
        branch = f"ckpt.{run}"
    try:
        check_ref_name(branch)
    except Exception as exc:  # InvalidName: the caller's mistake, said as Python says it
        raise ValueError(str(exc)) from None
    if _STEP_MARK in branch:
        raise ValueError(f"invalid checkpoint branch {branch!r}: it may not contain {_STEP_MARK!r}")
    return branch


def check_step(step: object) -> int:
    """``step`` if it is an int in ``[0, MAX_STEP)``; ValueError otherwise."""
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < MAX_STEP:
        raise ValueError(f"invalid step {step!r}: give an integer from 0 to {MAX_STEP - 1}")
    return step


def step_tag(branch: str, step: int) -> str:
    return f"{branch}{_STEP_MARK}{step}"


def step_dir(step: int) -> str:
    return f"step-{step}"


def tag_step(branch: str, tag: str) -> int | None:
    """The step a tag of ``branch``'s run marks complete, or None for any other tag."""
    prefix = branch + _STEP_MARK
    if not tag.startswith(prefix):
        return None
    digits = tag[len(prefix) :]
    if not digits.isascii() or not digits.isdigit() or (len(digits) > 1 and digits[0] == "0"):
        return None
    return int(digits)


def split_step_tag(tag: str) -> tuple[str, int] | None:
    """``(branch, step)`` of a tag that marks a complete checkpoint step, or None for any other tag."""
    branch, mark, _ = tag.rpartition(_STEP_MARK)
    if not mark or not branch:
        return None
    step = tag_step(branch, tag)
    return None if step is None else (branch, step)
