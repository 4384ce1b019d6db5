"""``HintingSampler``: any sampler of a :class:`~fabric.torch.FabricFileDataset`, telling
the server each epoch's order before it is read."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch.utils.data

from fabric.torch.files import FabricFileDataset
from fabric.torch.hints import Hinter
from fabric.torch.ranks import rank_and_world


class HintingSampler(torch.utils.data.Sampler[int]):
    """Yields what ``sampler`` yields. Each ``__iter__`` first draws the whole epoch's
    indices and sends them as one hint (the files of ``dataset`` in that order, replacing
    the job's previous order), so a spoke fetches ahead of the loader; a hint that fails
    is logged once and reading goes on. The hint is sent by a thread of the sampler's:
    the epoch's first reads do not wait for it (a long order takes several requests, and
    an epoch's start is time the accelerators wait); :attr:`last_hint` waits for it.
    ``set_epoch`` passes through (DistributedSampler).

    In a world of several ranks each rank's reads and hints are a job of their own
    (``JOB:rRANK``), so ranks that share a spoke keep their own orders: the rank is the
    sampler's (``DistributedSampler``), else torch.distributed's. Make this sampler before
    the DataLoader starts iterating (its workers take a copy of ``dataset``).
    """

    def __init__(self, sampler: torch.utils.data.Sampler[int] | Any, dataset: FabricFileDataset) -> None:
        self.sampler = sampler
        self.dataset = dataset
        if hasattr(sampler, "rank") and hasattr(sampler, "num_replicas"):
            rank, world = rank_and_world(sampler.rank, sampler.num_replicas)
        else:
            rank, world = rank_and_world()
        dataset.use_rank(rank, world)
        self._hinter = Hinter()
        self._sending: Future[dict[str, Any] | None] | None = None
        self._sender: ThreadPoolExecutor | None = None

    @property
    def last_hint(self) -> dict[str, Any] | None:
        """The server's answer to the last epoch's hint (waiting for it), None if it was not
        taken or none was sent."""
        return None if self._sending is None else self._sending.result()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_sending": None, "_sender": None}

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        indices = [int(i) for i in self.sampler]
        if self._sending is not None:
            self._sending.result()  # one epoch's hint after the other: the server keeps the last
        if self._sender is None:
            self._sender = ThreadPoolExecutor(1, thread_name_prefix="fabric-hint")
        self._sending = self._sender.submit(self._hinter.send, self.dataset.source.fs, [self.dataset.url(i) for i in indices])
        return iter(indices)
