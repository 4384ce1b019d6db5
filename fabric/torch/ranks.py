"""Who reads what: the distributed rank and world size, the DataLoader worker, and the job
id a reading stream sends with its hints and reads."""

from __future__ import annotations

import os
import uuid

import torch.distributed as dist
import torch.utils.data

from fabric.errors import BadRequest
from fabric.plane.jobs import check_job


def rank_and_world(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """``(rank, world_size)``: as given, else from ``torch.distributed`` when it is
    initialised, else from the environment ``torchrun`` sets (``RANK``, ``WORLD_SIZE``),
    else ``(0, 1)``. ValueError for one without the other or a rank outside the world."""
    if (rank is None) != (world_size is None):
        raise ValueError("pass both rank= and world_size=, or neither (then torch.distributed or RANK/WORLD_SIZE tell them)")
    if rank is None:
        if dist.is_available() and dist.is_initialized():
            rank, world_size = dist.get_rank(), dist.get_world_size()
        elif os.environ.get("RANK") and os.environ.get("WORLD_SIZE"):
            rank, world_size = _env_int("RANK"), _env_int("WORLD_SIZE")
        else:
            rank, world_size = 0, 1
    if not (isinstance(rank, int) and isinstance(world_size, int)) or world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size) and world_size at least 1, not rank={rank!r}, world_size={world_size!r}")
    return rank, world_size


def _env_int(name: str) -> int:
    try:
        return int(os.environ[name])
    except ValueError:
        raise ValueError(f"${name} must be an integer, not {os.environ[name]!r}") from None


def worker() -> tuple[int, int]:
    """``(worker id, number of workers)`` of the DataLoader worker running this code; ``(0, 1)`` in the main process."""
    info = torch.utils.data.get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


def job_id(job: str | None) -> str:
    """The job a dataset reads for: ``job``, else ``$FABRIC_JOB``, else a fresh id (so its
    hints and reads still name one job). ValueError for an id the servers would refuse."""
    job = job or os.environ.get("FABRIC_JOB") or f"torch-{uuid.uuid4().hex[:12]}"
    try:
        return check_job(job)
    except BadRequest as exc:
        raise ValueError(exc.message) from None


def stream_job(job: str, rank: int, world_size: int) -> str:
    """The job id one rank's reads and hints carry: ``job`` alone in a world of one, else
    ``job:rRANK``, so that ranks sharing a spoke do not replace each other's read order
    (a hint replaces the order of its job)."""
    if world_size == 1:
        return job
    stream = f"{job}:r{rank}"
    if len(stream) > 128:
        raise ValueError(f"job id {job!r} is too long to name rank {rank} ({stream!r} is over 128 characters)")
    return stream
