"""``fabric://`` URLs for webdataset: a handler for its URL opener (``gopen``).

webdataset opens each shard through ``webdataset.gopen.gopen``, which dispatches on the URL's
scheme and knows no fsspec protocols, so ``wds.WebDataset("fabric://…")`` needs the scheme
registered once per process::

    from fabric.fsspec.wds import register_webdataset

    register_webdataset(server="http://spoke:8700", token=TOKEN)  # or $FABRIC_SERVER/$FABRIC_TOKEN
    dataset = wds.WebDataset("fabric://images@v3/shards/train-{000000..000127}.tar", shardshuffle=100)

Shards are read as any ``fabric://`` file is (whole chunks, with readahead), and
``wds.TarWriter("fabric://REPO@BRANCH/…")`` writes a shard to a branch (staged when the writer
closes). DataLoader workers started by fork inherit the registration; with the ``spawn``
start method call :func:`register_webdataset` in ``worker_init_fn`` too.
"""

from __future__ import annotations

from typing import Any

import fsspec

from fabric.fsspec.filesystem import FabricFileSystem

#: The URL scheme registered with webdataset.
SCHEME = FabricFileSystem.protocol


class FabricShardOpener:
    """webdataset's handler for ``fabric://`` URLs: opens a shard for reading (``rb``) or
    writing (``wb``) with the file system made of ``storage_options``.

    The file system comes from fsspec's instance cache, so each process (a forked DataLoader
    worker too) gets one of its own and reuses it for every shard."""

    def __init__(self, **storage_options: Any) -> None:
        self.storage_options = storage_options

    def __call__(self, url: str, mode: str = "rb", bufsize: int = 8192, **kwargs: Any) -> Any:
        if mode not in ("rb", "wb"):
            raise ValueError(f"{url}: mode {mode!r}: webdataset opens shards with rb or wb")
        fs = fsspec.filesystem(SCHEME, **self.storage_options)
        return fs.open(url, mode)


def register_webdataset(server: str | None = None, token: str | None = None, **storage_options: Any) -> FabricShardOpener:
    """Make webdataset open ``fabric://`` URLs in this process with a :class:`FabricFileSystem`
    of these options (``server`` and ``token`` default to ``$FABRIC_SERVER`` and
    ``$FABRIC_TOKEN``); a later call replaces the options. Returns the handler registered.

    Raises ImportError if webdataset is not installed."""
    from webdataset.gopen import gopen_schemes  # imported here: webdataset is optional for fabric

    opener = FabricShardOpener(server=server, token=token, **storage_options)
    gopen_schemes[SCHEME] = opener
    return opener
