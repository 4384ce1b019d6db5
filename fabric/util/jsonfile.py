"""Small JSON files replaced whole: a reader sees the old content or the new, never half."""

from __future__ import annotations

import json
import os
from typing import Any


def write_json(path: str, value: Any, durable: bool = False) -> None:
    """Write ``value`` to ``path`` through a temporary file and a rename; ``durable``: fsync first."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def fsync_dir(directory: str) -> None:
    """Make the names in ``directory`` (a rename or link into it) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
