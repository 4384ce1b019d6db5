"""``FabricShardDataset``: an iterable dataset over tar or parquet shards, each shard read
by exactly one DataLoader worker of one rank."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch.utils.data

from fabric.torch.hints import Hinter
from fabric.torch.ranks import job_id, rank_and_world, stream_job, worker
from fabric.torch.samples import parquet_rows, tar_samples
from fabric.torch.source import Source

#: Shard kinds by file name ending.
KINDS = {".tar": "tar", ".tar.gz": "tar", ".tgz": "tar", ".parquet": "parquet"}


def identity(sample: Any) -> Any:
    return sample


def kind_of(path: str) -> str | None:
    return next((kind for end, kind in KINDS.items() if path.endswith(end)), None)


def shard_order(count: int, seed: int | None, epoch: int) -> list[int]:
    """The shard indices in the order of ``epoch``: as listed without a seed, else shuffled
    by ``(seed, epoch)`` the same way in every process."""
    order = list(range(count))
    if seed is not None:
        random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


def assign(order: Sequence[int], rank: int, world_size: int, worker_id: int, workers: int) -> list[int]:
    """The shards of one worker of one rank: every ``world_size * workers``-th of ``order``,
    so the readers of a world share the shards without overlap and without leaving any out."""
    return list(order[rank * workers + worker_id :: world_size * workers])


class FabricShardDataset(torch.utils.data.IterableDataset):
    """Samples of the shards ``urls`` (a list of ``fabric://REPO@REF/path``) or of the shards
    under a prefix (one URL: the files ending in ``.tar``/``.parquet``, sorted). ``kind``:
    ``"tar"`` (samples are members grouped by key, as in webdataset: ``{"__key__",
    "__url__", ext: bytes}``) or ``"parquet"`` (rows as dicts); by default from the file
    names. Each sample is passed through ``decode``.

    Shards are split across DataLoader workers and ranks (``rank``/``world_size``, else
    torch.distributed's, else ``$RANK``/``$WORLD_SIZE``) so each is read exactly once per
    epoch. ``shuffle_shards``: a seed; each epoch (:meth:`set_epoch`, called before
    iterating a DataLoader without persistent workers) reads the shards in a different
    order, the same in every process. With ``hints`` the first worker of each rank tells
    the server the rank's shard order (its workers' orders interleaved), under the rank's
    job id (``JOB:rRANK`` in a world of several). Refs are resolved to commits once.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        kind: str | None = None,
        decode: Callable[[Any], Any] = identity,
        shuffle_shards: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        server: str | None = None,
        token: str | None = None,
        job: str | None = None,
        hints: bool = True,
    ) -> None:
        if kind not in (None, "tar", "parquet"):
            raise ValueError(f"kind must be 'tar' or 'parquet', not {kind!r}")
        if (rank is None) != (world_size is None):
            raise ValueError("pass both rank= and world_size=, or neither")
        if rank is not None:
            rank_and_world(rank, world_size)
        self.job = job_id(job)
        self.source = Source(server, token, self.job)
        self.shards = self._list(urls, kind)
        kinds = {kind or kind_of(s) for s in self.shards}
        if None in kinds or len(kinds) > 1:
            raise ValueError(f"cannot tell the shard kind from the names ({', '.join(self.shards[:3])}...): pass kind='tar' or kind='parquet'")
        self.kind = kinds.pop()
        self.decode = decode
        self.seed = shuffle_shards
        self.epoch = 0
        self.rank, self.world_size = rank, world_size
        self.hints = hints
        self._hinter = Hinter()
        self._streams: dict[str, Source] = {}

    def _list(self, urls: str | Sequence[str], kind: str | None) -> list[str]:
        if isinstance(urls, str):
            ends = tuple(e for e, k in KINDS.items() if kind in (None, k))
            return [name for name, _ in self.source.files(urls, ends)]
        if not urls:
            raise ValueError("no shards: pass a prefix or a non-empty list of shard URLs")
        out = []
        for url, (root, key) in zip(urls, self.source.pin(urls)):
            if not key:
                raise ValueError(f"{url!r} names a repository, not a shard file")
            out.append(f"{root}/{key}")
        return out

    def __getstate__(self) -> dict[str, Any]:
        """Pickled for a spawned worker, where torch.distributed is not initialised: the
        rank and world size are taken here, in the process that has them."""
        state = dict(self.__dict__)
        if state["rank"] is None:
            state["rank"], state["world_size"] = rank_and_world()
        return state

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def shards_of(self, rank: int, world_size: int, worker_id: int, workers: int) -> list[str]:
        """The shards one worker of one rank reads this epoch, in order."""
        order = shard_order(len(self.shards), self.seed, self.epoch)
        return [self.shards[i] for i in assign(order, rank, world_size, worker_id, workers)]

    def __iter__(self) -> Iterator[Any]:
        rank, world = rank_and_world(self.rank, self.world_size)
        worker_id, workers = worker()
        job = stream_job(self.job, rank, world)
        source = self._streams.setdefault(job, self.source.with_job(job))
        if self.hints and worker_id == 0:
            lists = [self.shards_of(rank, world, w, workers) for w in range(workers)]
            rounds = itertools.zip_longest(*lists)
            self._hinter.send(source.fs, [s for r in rounds for s in r if s is not None])
        for shard in self.shards_of(rank, world, worker_id, workers):
            with source.fs.open(shard, "rb") as f:
                samples = tar_samples(f, shard) if self.kind == "tar" else parquet_rows(f)
                for sample in samples:
                    yield self.decode(sample)
