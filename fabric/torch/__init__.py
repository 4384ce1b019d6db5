"""PyTorch datasets over a hub's or spoke's repositories (the ``torch`` extra).

:class:`FabricFileDataset` (:mod:`.files`) is a map-style dataset: one sample per file
under a prefix, read whole and decoded by a function of the caller's.
:class:`FabricShardDataset` (:mod:`.shards`) is an iterable dataset over tar or parquet
shards, split across DataLoader workers and distributed ranks (:mod:`.ranks`) without
overlap; :mod:`.samples` reads the samples of one shard. Both tell the server the order
they will read in, so a spoke prefetches ahead of the loader: the map-style dataset
through :class:`HintingSampler` (:mod:`.sampler`), the iterable one by itself.
:func:`hint` sends the same hint for a job that reads through a mount (:mod:`.hints`).
:mod:`.source` opens the ``fabric://`` file system each process reads through.

Importing :mod:`fabric` never imports torch: only this package does, when it is used.

May import: :mod:`fabric.fsspec`, :mod:`fabric.client` and the layers below them;
nothing in :mod:`fabric` imports this package.
"""

from fabric.torch.files import FabricFileDataset
from fabric.torch.hints import hint
from fabric.torch.sampler import HintingSampler
from fabric.torch.shards import FabricShardDataset

__all__ = ["FabricFileDataset", "FabricShardDataset", "HintingSampler", "hint"]
