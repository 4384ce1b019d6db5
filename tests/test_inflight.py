"""fabric.util.inflight: calls in a few background threads, bounded in flight."""

from __future__ import annotations

import contextvars
import threading
import time
from concurrent.futures import Future

import pytest

from fabric.util import inflight as inflight_module
from fabric.util.inflight import Inflight

_purpose: contextvars.ContextVar[str] = contextvars.ContextVar("purpose", default="none")


def test_no_more_than_depth_calls_run_at_once_and_submit_waits_for_a_slot() -> None:
    release = threading.Event()
    lock = threading.Lock()
    running = peak = 0

    def call() -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        release.wait(5)
        with lock:
            running -= 1

    with Inflight(3, "t") as inflight:
        for _ in range(3):
            inflight.submit(call)
        fourth = threading.Thread(target=inflight.submit, args=(call,))
        fourth.start()
        time.sleep(0.2)
        assert fourth.is_alive(), "a fourth call was let in while three ran"
        release.set()
        fourth.join(5)
        assert not fourth.is_alive()
    assert peak == 3
    assert running == 0, "leaving the block waits for every call"


def test_calls_see_the_submitters_context_variables() -> None:
    seen: list[str] = []
    token = _purpose.set("push")
    try:
        with Inflight(2, "t") as inflight:
            inflight.submit(lambda: seen.append(_purpose.get()))
    finally:
        _purpose.reset(token)
    assert seen == ["push"]


def test_the_first_error_is_raised_by_wait_and_stops_later_submits() -> None:
    ran: list[int] = []

    def fail() -> None:
        raise OSError("link down")

    inflight = Inflight(2, "t")
    inflight.submit(fail)
    with pytest.raises(OSError, match="link down"):
        inflight.wait()
    with pytest.raises(OSError, match="link down"):
        inflight.submit(lambda: ran.append(1))
    inflight.close()
    assert ran == []


def test_a_clean_exit_raises_a_calls_error() -> None:
    def fail() -> None:
        raise ValueError("bad pack")

    with pytest.raises(ValueError, match="bad pack"), Inflight(1, "t") as inflight:
        inflight.submit(fail)


def test_an_exit_by_an_exception_does_not_wait_for_calls_still_running() -> None:
    release = threading.Event()
    started = time.monotonic()
    with pytest.raises(KeyError), Inflight(1, "t") as inflight:
        inflight.submit(lambda: release.wait(5))
        raise KeyError("caller failed")
    assert time.monotonic() - started < 2
    release.set()


class _IdlePool:
    """A stand-in for ThreadPoolExecutor whose calls wait in its queue until it shuts down."""

    def __init__(self, *args, **kwargs) -> None:
        self.queued: list[Future] = []

    def submit(self, fn, *args) -> Future:
        self.queued.append(Future())
        return self.queued[-1]

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        for f in self.queued:
            if cancel_futures:
                f.cancel()


def test_a_call_closed_before_it_starts_is_told_instead(monkeypatch) -> None:
    """A call the pool never started (closed after an error) has its ``on_cancel`` called,
    once; the push of write-back relies on it to release the chunks it claimed."""
    monkeypatch.setattr(inflight_module, "ThreadPoolExecutor", _IdlePool)
    told: list[int] = []
    inflight = Inflight(2, "t")
    inflight.submit(lambda: None, on_cancel=lambda: told.append(1))
    inflight.submit(lambda: None)  # (no on_cancel: nothing to tell)
    assert told == []
    inflight.close()
    assert told == [1]


def test_depth_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Inflight(0, "t")
