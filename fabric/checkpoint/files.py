"""Checkpoints without torch: a mapping of names to bytes, one file per name under ``step-N/``."""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fabric import errors
from fabric.format import checkpoint_names as names
from fabric.format.paths import check_path
from fabric.fsspec.errors import fs_errors

if TYPE_CHECKING:
    from fabric.checkpoint.run import Checkpoint, Checkpoints

_BYTES = (bytes, bytearray, memoryview)


def is_files(state: Any) -> bool:
    """True for a non-empty mapping whose every value is bytes-like."""
    return isinstance(state, Mapping) and bool(state) and all(isinstance(v, _BYTES) for v in state.values())


def save(ckpts: Checkpoints, state: Mapping[str, Any], step: int, overwrite: bool) -> Checkpoint:
    """Store each value as ``step-N/NAME`` on the run's branch, then finish the step.
    ValueError, before anything is written, for a name that is not a relative path."""
    for name in state:
        try:
            check_path(name)
        except (errors.InvalidPath, TypeError) as exc:
            raise ValueError(f"checkpoint file name {name!r}: {getattr(exc, 'message', exc)}") from None
    base = ckpts.begin(step, overwrite)
    prefix = names.step_dir(step)
    with fs_errors(f"{ckpts.repo}@{ckpts.branch}/{prefix}"):
        for name, data in state.items():
            if ckpts.fs.copies:  # (through fabric://, which leaves local copies of large files)
                ckpts.fs.pipe_file(f"{ckpts.repo}@{ckpts.branch}/{prefix}/{name}", bytes(data))
            else:
                ckpts.plane.put_object(ckpts.repo, ckpts.branch, f"{prefix}/{name}", io.BytesIO(bytes(data)))
    return ckpts.finish(step, base, names.FILES, overwrite)


def load(ckpts: Checkpoints, ckpt: Checkpoint) -> dict[str, bytes]:
    """Every file of the checkpoint, by name, read in one batch."""
    paths = ckpts.fs.find(ckpt.path)
    data = ckpts.fs.cat(paths) if paths else {}
    return {p[len(ckpt.path) + 1 :]: data[p] for p in paths}
