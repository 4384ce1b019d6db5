"""Advice a client (a mount, ``fabric://``) sends its server from one background thread: no
read ever waits for it.

At most ``queued`` items wait (more are dropped), an item that fails is logged and not
retried, and the thread is a daemon: a process that ends with items queued drops them.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from typing import Generic, TypeVar

from fabric.errors import FabricError

log = logging.getLogger("fabric.client")

T = TypeVar("T")


class Advice(Generic[T]):
    """Sends each item :meth:`offer` takes with :meth:`send` (a subclass's), one at a time."""

    def __init__(self, queued: int, name: str) -> None:
        self._queue: queue.Queue[T | None] = queue.Queue(queued)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def offer(self, item: T) -> None:
        with contextlib.suppress(queue.Full):  # advice: an item that finds no room is dropped
            self._queue.put_nowait(item)

    def close(self) -> None:
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            return  # the thread is a daemon: it ends with the process
        self._thread.join(5)

    def send(self, item: T) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                self.send(item)
            except (FabricError, OSError) as exc:  # advice only: the reads go on without it
                log.debug("%s: not taken by the server: %s", self._thread.name, exc)
