"""Decorators around :class:`~fabric.store.base.ObjectStore`.

Retries, metrics and fault injection wrap any backend instead of living in
each one (as restic's backend wrappers do). Wrappers nest:
``RetryingStore(CountingStore(S3Store(...)))`` counts every attempt.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Collection, Iterator
from typing import TypeVar

from botocore.exceptions import (
    ClientError,
    HTTPClientError,
    IncompleteReadError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from fabric.errors import FabricError, Unavailable
from fabric.store.base import ObjectInfo, ObjectStore, validate_prefix

log = logging.getLogger(__name__)

T = TypeVar("T")


class StoreWrapper(ObjectStore):
    """Delegates every call to ``inner`` through :meth:`_call`, the one hook
    subclasses override. ``list`` passes through ``_call`` when it is called,
    not while it is iterated."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner

    def _call(self, op: str, key: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` (the inner call for operation ``op`` on ``key``)."""
        return fn()

    def put(self, key: str, data: bytes | memoryview) -> None:
        self._call("put", key, lambda: self.inner.put(key, data))

    def remove_stale_temporaries(self, older_than: float) -> int:
        return self._call("cleanup", "", lambda: self.inner.remove_stale_temporaries(older_than))

    def put_file(self, key: str, path: str) -> None:
        self._call("put_file", key, lambda: self.inner.put_file(key, path))

    def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        return self._call("get", key, lambda: self.inner.get(key, offset, length))

    def get_ranges(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        return self._call("get_ranges", key, lambda: self.inner.get_ranges(key, ranges))

    def stat(self, key: str) -> ObjectInfo:
        return self._call("stat", key, lambda: self.inner.stat(key))

    def exists(self, key: str) -> bool:
        return self._call("exists", key, lambda: self.inner.exists(key))

    def delete(self, key: str) -> None:
        self._call("delete", key, lambda: self.inner.delete(key))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        return self._call("list", prefix, lambda: self.inner.list(prefix))

    @property
    def url(self) -> str:
        return self.inner.url

    def describe(self) -> str:
        return f"{type(self).__name__}({self.inner.describe()})"


# -- retries -------------------------------------------------------------

# OSErrors that repeating the same call will not fix.
_PERMANENT_OS_ERRORS = (
    FileNotFoundError,
    FileExistsError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
)

# S3 error codes that mean "slow down" or "try again".
_TRANSIENT_S3_CODES = frozenset(
    {
        "InternalError",
        "ServiceUnavailable",
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
    }
)


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the call that raised ``exc`` may succeed.

    Fabric errors are final (``ObjectNotFound``, ``BadRequest``, …) except
    ``Unavailable``. S3 errors are transient when throttled or 5xx (but not
    501). Connection and read errors are transient, and so are ``OSError``s
    other than not-found/exists/permission/type errors.
    """
    if isinstance(exc, FabricError):
        return isinstance(exc, Unavailable)
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        return code in _TRANSIENT_S3_CODES or status == 429 or (status >= 500 and status != 501)
    if isinstance(exc, (BotoConnectionError, HTTPClientError, IncompleteReadError)):
        return True
    if isinstance(exc, OSError):
        return not isinstance(exc, _PERMANENT_OS_ERRORS)
    return False


class RetryingStore(StoreWrapper):
    """Retries calls that fail with a transient error (see :func:`is_transient`).

    Up to ``attempts`` tries in all, sleeping between them with exponential
    backoff (``base_delay * 2**n``, capped at ``max_delay``) and jitter (a
    random half to all of it). Safe because every operation is idempotent
    (puts are atomic replaces). The last error is raised unchanged. A listing
    that fails midway resumes after the last key it yielded.
    """

    def __init__(
        self,
        inner: ObjectStore,
        attempts: int = 5,
        base_delay: float = 0.05,
        max_delay: float = 2.0,
        *,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        super().__init__(inner)
        self.attempts = attempts
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._sleep = sleep

    def _backoff(self, attempt: int, op: str, key: str, exc: Exception) -> None:
        """Sleep before retry number ``attempt`` (1-based) after ``exc``."""
        cap = min(self.max_delay, self.base_delay * 2 ** (attempt - 1))
        delay = random.uniform(cap / 2, cap)
        log.warning(
            "%s %r on %s failed (%s: %s); retry %d of %d in %.2fs",
            op, key, self.inner.describe(), type(exc).__name__, exc,
            attempt, self.attempts - 1, delay,
        )  # fmt: skip
        self._sleep(delay)

    def _call(self, op: str, key: str, fn: Callable[[], T]) -> T:
        for attempt in range(1, self.attempts):
            try:
                return fn()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                self._backoff(attempt, op, key, exc)
        return fn()

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        validate_prefix(prefix)
        return self._list(prefix)

    def _list(self, prefix: str) -> Iterator[ObjectInfo]:
        last: str | None = None
        failures = 0
        while True:
            progressed = False
            try:
                for info in self.inner.list(prefix):
                    if last is not None and info.key <= last:
                        continue  # already yielded before the failure
                    last, progressed = info.key, True
                    yield info
                return
            except Exception as exc:
                failures = 1 if progressed else failures + 1
                if failures >= self.attempts or not is_transient(exc):
                    raise
                self._backoff(failures, "list", prefix, exc)


# -- metrics -------------------------------------------------------------


class CountingStore(StoreWrapper):
    """Counts calls, errors and bytes per operation; thread-safe.

    :attr:`counters` maps each operation name (``put``, ``put_file``,
    ``get``, ``get_ranges``, ``stat``, ``exists``, ``delete``, ``list``) to
    ``{"calls", "errors", "bytes"}``. ``bytes`` is what went into the store
    for ``put``/``put_file`` and what came out for ``get``/``get_ranges``
    (successful calls only); ``list`` counts calls and errors while iterating.
    """

    OPERATIONS = ("put", "put_file", "get", "get_ranges", "stat", "exists", "delete", "list")

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self._lock = threading.Lock()
        self._counters = {op: {"calls": 0, "errors": 0, "bytes": 0} for op in self.OPERATIONS}

    @property
    def counters(self) -> dict[str, dict[str, int]]:
        """A snapshot of the counters."""
        with self._lock:
            return {op: dict(values) for op, values in self._counters.items()}

    def _add(self, op: str, field: str, amount: int = 1) -> None:
        with self._lock:
            self._counters[op][field] += amount

    def _call(self, op: str, key: str, fn: Callable[[], T]) -> T:
        self._add(op, "calls")
        try:
            return fn()
        except Exception:
            self._add(op, "errors")
            raise

    def put(self, key: str, data: bytes | memoryview) -> None:
        super().put(key, data)
        self._add("put", "bytes", memoryview(data).nbytes)

    def put_file(self, key: str, path: str) -> None:
        super().put_file(key, path)
        self._add("put_file", "bytes", os.path.getsize(path))

    def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        data = super().get(key, offset, length)
        self._add("get", "bytes", len(data))
        return data

    def get_ranges(self, key: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        parts = super().get_ranges(key, ranges)
        self._add("get_ranges", "bytes", sum(map(len, parts)))
        return parts

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        return self._counted_list(super().list(prefix))

    def _counted_list(self, items: Iterator[ObjectInfo]) -> Iterator[ObjectInfo]:
        try:
            yield from items
        except Exception:
            self._add("list", "errors")
            raise


# -- fault injection -----------------------------------------------------


def _injected_error(op: str, key: str) -> Exception:
    return OSError(errno.EIO, f"injected fault in {op} {key!r}")


class FaultInjectingStore(StoreWrapper):
    """Makes chosen calls fail, for tests.

    A call is *eligible* when its operation is in ``ops`` (all if None) and
    its key (the prefix, for ``list``) starts with ``fail_keys_prefix`` (any
    key if None). Eligible calls are numbered from 1; call ``n`` fails when
    ``n <= fail_first`` or ``n % fail_every == 0``, and every eligible call
    fails when neither is given. A failure raises ``error(op, key)`` (an
    ``OSError(EIO)`` by default) before the inner call, or after it succeeded
    when ``after`` is true (a lost reply: the write happened, the caller
    cannot know). :attr:`injected` counts the faults raised.
    """

    def __init__(
        self,
        inner: ObjectStore,
        fail_every: int | None = None,
        fail_keys_prefix: str | None = None,
        *,
        fail_first: int | None = None,
        ops: Collection[str] | None = None,
        after: bool = False,
        error: Callable[[str, str], Exception] = _injected_error,
    ) -> None:
        if fail_every is not None and fail_every < 1:
            raise ValueError("fail_every must be at least 1")
        super().__init__(inner)
        self.fail_every = fail_every
        self.fail_first = fail_first
        self.fail_keys_prefix = fail_keys_prefix
        self.ops = None if ops is None else frozenset(ops)
        self.after = after
        self.error = error
        self.injected = 0
        self._eligible = 0
        self._lock = threading.Lock()

    def _should_fail(self, op: str, key: str) -> bool:
        if self.ops is not None and op not in self.ops:
            return False
        if self.fail_keys_prefix is not None and not key.startswith(self.fail_keys_prefix):
            return False
        with self._lock:
            self._eligible += 1
            n = self._eligible
            if self.fail_first is None and self.fail_every is None:
                fail = True
            else:
                fail = (self.fail_first is not None and n <= self.fail_first) or (
                    self.fail_every is not None and n % self.fail_every == 0
                )
            self.injected += fail
        return fail

    def _call(self, op: str, key: str, fn: Callable[[], T]) -> T:
        if not self._should_fail(op, key):
            return fn()
        if self.after:
            fn()
        raise self.error(op, key)
