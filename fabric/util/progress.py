"""Progress reporting for long operations, decoupled from any terminal library.

Engine code calls ``progress.start(total, unit, desc)`` / ``advance(n)`` /
``close()``; the CLI passes a :class:`TqdmProgress`, library callers get
:class:`Progress` (which reports nothing) by default.
"""

from __future__ import annotations

import sys
import threading


class Progress:
    """Reports nothing; the interface long operations call."""

    def start(self, total: int | None, unit: str = "B", desc: str = "") -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


class TqdmProgress(Progress):
    """A progress bar on stderr; ``enabled=None`` shows it only when stderr is a terminal."""

    def __init__(self, enabled: bool | None = None) -> None:
        self._bar = None
        self._lock = threading.Lock()
        self._enabled = sys.stderr.isatty() if enabled is None else enabled

    def start(self, total: int | None, unit: str = "B", desc: str = "") -> None:
        self.close()
        if not self._enabled:
            return
        from tqdm import tqdm

        scale = unit == "B"
        self._bar = tqdm(total=total, unit=unit, unit_scale=scale, unit_divisor=1024 if scale else 1000, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True)

    def advance(self, n: int = 1) -> None:
        if self._bar is not None:
            with self._lock:
                self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
