"""``fabric://`` for fsspec: a hub's or spoke's repositories as an fsspec file system, so
pandas, pyarrow, Hugging Face ``datasets``, torch and every other fsspec user read and
write them by URL (``fabric://REPO@REF/path``).

:mod:`.filesystem` is the file system, :mod:`.files` its open files, :mod:`.chunks` the
chunk-level reads they share, :mod:`.locations` the paths it takes and :mod:`.errors` the
exceptions fsspec users expect; :mod:`.wds` opens ``fabric://`` shards for webdataset.
fsspec finds the file system through the ``fsspec.specs`` entry point ``fabric`` in
``pyproject.toml``.

May import: :mod:`fabric.client` and the layers below it; nothing imports this package.
"""

from fabric.fsspec.filesystem import FabricFileSystem

__all__ = ["FabricFileSystem"]
