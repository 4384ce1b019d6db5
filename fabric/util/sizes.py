"""Human sizes: ``512MiB``, ``50G``, ``1.5TB``, plain byte counts."""

from __future__ import annotations

import re

from fabric.errors import BadRequest

_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Binary units: ``K``/``KiB``/``KB`` all mean 1024 bytes."""
    m = _SIZE.match(text)
    if not m:
        raise BadRequest(f"invalid size {text!r}: use a number with an optional unit, e.g. 512MiB or 50G")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
