"""The SQL catalog: repositories, refs, staging, and the chunk index."""

from fabric.catalog.catalog import Catalog, RefRow
from fabric.catalog.db import Database, redact

__all__ = ["Catalog", "Database", "RefRow", "redact"]
