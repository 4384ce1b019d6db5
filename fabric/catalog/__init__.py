"""The SQL catalog: repositories, refs, staging, and the chunk index."""

from .catalog import Catalog, RefRow
from .db import Database, redact

__all__ = ["Catalog", "Database", "RefRow", "redact"]
