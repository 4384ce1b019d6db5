"""Calls run by a few background threads, with a bound on how many are in flight.

Used where a sender must keep several requests on a link at once (packs uploaded
across a WAN: one at a time leaves the link idle for a round trip and the server's
time per request) without holding more than a few requests' bytes in memory.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor


class Inflight:
    """Run calls in up to ``depth`` background threads, at most ``depth`` at once.

    - :meth:`submit` waits while ``depth`` calls run, so the caller never gets further
      ahead than that (its memory stays bounded).
    - Each call runs in a copy of the submitter's context: context variables (a traffic
      purpose, a request's job) carry over to the thread.
    - The first error a call raises is kept: the next :meth:`submit` or :meth:`wait`
      raises it, and nothing more is started.
    - :meth:`wait` returns once every submitted call has ended. Used as a context
      manager, a clean exit waits (and raises the first error); an exit by an
      exception cancels what has not started and does not wait.

    Safe to use from many threads.
    """

    def __init__(self, depth: int, name: str) -> None:
        if depth < 1:
            raise ValueError(f"depth must be at least 1, not {depth}")
        self._depth = depth
        self._name = name
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(depth)
        self._pool: ThreadPoolExecutor | None = None
        self._running: set[Future[object]] = set()
        self._error: BaseException | None = None

    def submit(self, call: Callable[[], object], on_cancel: Callable[[], None] | None = None) -> None:
        """Start ``call`` in the background once fewer than ``depth`` calls run; ``on_cancel`` is
        called instead if it never starts (an exit by an exception, :meth:`close`)."""
        self.raise_error()
        self._slots.acquire()
        try:
            self.raise_error()
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self._depth, thread_name_prefix=self._name)
                future = self._pool.submit(contextvars.copy_context().run, call)
                self._running.add(future)
        except BaseException:
            self._slots.release()
            raise
        if on_cancel is not None:
            future.add_done_callback(lambda f: on_cancel() if f.cancelled() else None)
        future.add_done_callback(self._finished)

    def wait(self) -> None:
        """Wait for every call submitted so far; raise the first error one of them raised."""
        with self._lock:
            running = list(self._running)
        for future in running:
            future.exception()  # waits; the error is kept by _finished
        self.raise_error()

    def raise_error(self) -> None:
        """Raise the first error a call raised, if any did."""
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Stop the threads: calls not started are cancelled, running ones finish on their own."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> Inflight:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                self.wait()
        finally:
            self.close()

    def _finished(self, future: Future[object]) -> None:
        with self._lock:
            self._running.discard(future)
            if self._error is None and not future.cancelled() and future.exception() is not None:
                self._error = future.exception()
        self._slots.release()
