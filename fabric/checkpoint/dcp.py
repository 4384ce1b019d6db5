"""Checkpoints through torch Distributed Checkpoint (DCP) on ``fabric://``.

:class:`CommittingWriter` is DCP's ``FsspecWriter`` whose ``finish`` — run by the
coordinator rank once every rank's files are stored, and ending with the rename of
``.metadata`` into place — then commits and tags the step. Imported only for DCP saves and
loads, so ``import fabric`` never imports torch.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

from fabric.format import checkpoint_names as names

if TYPE_CHECKING:
    from fabric.checkpoint.run import Checkpoint, Checkpoints


class CommittingWriter(FsspecWriter):
    """``FsspecWriter`` that calls ``on_finish()`` after the checkpoint's ``.metadata`` is in place."""

    def __init__(self, path: str, on_finish: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self._on_finish = on_finish

    def finish(self, metadata: Any, results: Any) -> None:
        super().finish(metadata, results)
        self._on_finish()


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


@contextlib.contextmanager
def _single_process() -> Iterator[None]:
    """Without a process group a single-process save or load is what was meant: DCP's warning
    that it assumes so is noise."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def save(ckpts: Checkpoints, state_dict: Any, step: int, overwrite: bool, **options: Any) -> Checkpoint:
    """Save through DCP: rank 0 begins (the others wait for it), every rank writes its files
    (``options`` go to the writer; files are not fsynced: the hub's commit is the durable
    point), the coordinator finishes; every rank returns the checkpoint."""
    names.check_step(step)
    multi = _distributed()
    started: list[Any] = [None]
    if not multi or dist.get_rank() == 0:
        try:
            started[0] = ckpts.begin(step, overwrite)
        except Exception as exc:
            if not multi:
                raise
            started[0] = exc
    if multi:
        dist.broadcast_object_list(started, src=0)
    if isinstance(started[0], BaseException):
        raise RuntimeError(f"checkpoint step {step}: rank 0 could not start the save: {started[0]}") from started[0]
    done: list[Any] = [None]

    def on_finish() -> None:
        done[0] = ckpts.finish(step, started[0], names.DCP, overwrite)

    options.setdefault("sync_files", False)
    writer = CommittingWriter(ckpts.step_url(step), on_finish, **options, **ckpts.storage_options)
    with contextlib.nullcontext() if multi else _single_process():
        dcp.save(state_dict, storage_writer=writer, no_dist=not multi)
    if multi:
        dist.broadcast_object_list(done, src=0)
    return done[0]


def load(ckpts: Checkpoints, ckpt: Checkpoint, state_dict: Any) -> Any:
    """Load the checkpoint into ``state_dict`` in place (every rank, when a group is initialized)."""
    multi = _distributed()
    with contextlib.nullcontext() if multi else _single_process():
        dcp.load(state_dict, storage_reader=FsspecReader(ckpt.url, **ckpts.storage_options), no_dist=not multi)
    return state_dict
