"""``FabricFileDataset``: a map-style dataset with one sample per file under a prefix."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch.utils.data

from fabric.torch.ranks import job_id, stream_job
from fabric.torch.source import Source


def raw(data: bytes, path: str) -> bytes:
    """The default decoder: a sample is the file's bytes."""
    return data


class FabricFileDataset(torch.utils.data.Dataset):
    """The files under ``url`` (``fabric://REPO@REF/prefix``, ``REPO@REF/prefix`` or
    ``REPO/prefix`` for the default branch), listed once, sorted by path: sample ``i`` is
    ``decode(bytes_of_file_i, path_i)``, ``path_i`` the path in the repository
    (``self.paths[i]``). ``suffixes`` keeps only files ending in one of them.

    The ref is resolved to its commit when the dataset is made, so every worker and epoch
    reads that version. Reads go through ``fabric://``: a batch the DataLoader asks for
    (``__getitems__``) fetches the chunks of all its files in one request. ``job``
    (default ``$FABRIC_JOB``, else a fresh id) names the job to the server. The dataset
    pickles without its connection, so DataLoader workers reconnect on first use;
    ``decode`` must pickle too where workers are spawned rather than forked.

    Wrap the sampler in :class:`~fabric.torch.HintingSampler` so a spoke prefetches in
    the sampler's order.
    """

    def __init__(
        self,
        url: str,
        decode: Callable[[bytes, str], Any] = raw,
        server: str | None = None,
        token: str | None = None,
        job: str | None = None,
        suffixes: Iterable[str] | None = None,
    ) -> None:
        self.decode = decode
        self.job = job_id(job)
        self.source = Source(server, token, self.job)
        files = self.source.files(url, suffixes)
        self.root = files[0][0].partition("/")[0]  # REPO@COMMIT
        self.paths = [name.partition("/")[2] for name, _ in files]
        self.sizes = [size for _, size in files]

    def __len__(self) -> int:
        return len(self.paths)

    def url(self, index: int) -> str:
        """The ``fabric://`` path (without protocol) of sample ``index``'s file."""
        return f"{self.root}/{self.paths[index]}"

    def __getitem__(self, index: int) -> Any:
        return self.decode(self.source.fs.cat_file(self.url(index)), self.paths[index])

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """A batch of samples, their files' chunks fetched in one request."""
        datas = self.source.fs.cat_ranges([self.url(i) for i in indices], None, None, on_error="raise")
        return [self.decode(data, self.paths[i]) for i, data in zip(indices, datas)]

    def use_rank(self, rank: int, world_size: int) -> None:
        """Name this rank's stream of reads (:func:`~fabric.torch.ranks.stream_job`), so
        its hints and reads are one job at the server; call before the DataLoader starts
        its workers (:class:`~fabric.torch.HintingSampler` does)."""
        self.source = self.source.with_job(stream_job(self.job, rank, world_size))
