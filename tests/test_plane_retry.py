"""RetryingPlane: transient failures retried with backoff, others raised at once, and
ServerGone once an outage shared by every caller has lasted the server timeout.

Unit tests over a stub plane whose calls fail a scripted number of times.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from fabric.errors import BadRequest, FabricError, NotFound, Unavailable
from fabric.plane.retry import Health, RetryingPlane, ServerGone, is_transient


class BadGateway(FabricError):
    status = 502
    code = "bad_gateway"


class FlakyPlane:
    """``stat`` fails with each error in ``failures`` in turn, then answers; ``walk`` yields
    two entries, failing between them while ``walk_failures`` lasts."""

    url = "http://stub"

    def __init__(self, failures: list[BaseException] | None = None, walk_failures: int = 0) -> None:
        self.failures = list(failures or [])
        self.walk_failures = walk_failures
        self.calls = 0
        self.walks = 0

    def stat(self, repo: str, ref: str, path: str) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return f"{repo}@{ref}:{path}"

    def walk(self, repo: str, ref: str, prefix: str = "") -> Iterator[str]:
        self.walks += 1
        yield prefix + "a"
        if self.walk_failures:
            self.walk_failures -= 1
            raise Unavailable("the server went away mid-walk")
        yield prefix + "b"


class Down:
    """A plane whose server is gone: every call fails with a connection error."""

    def __init__(self) -> None:
        self.calls = 0

    def stat(self, repo: str, ref: str, path: str) -> str:
        self.calls += 1
        raise httpx.ConnectError("connection refused")


def test_transient_failures_are_retried_until_the_call_succeeds() -> None:
    health = Health(timeout=30)
    inner = FlakyPlane([Unavailable("restarting"), httpx.ConnectError("refused"), BadGateway("proxy")])
    plane = RetryingPlane(inner, health)
    assert plane.stat("r", "main", "f") == "r@main:f"
    assert inner.calls == 4
    assert health.retries == 3
    assert health.outages == 1
    assert health.down_since is None  # the call that got through ended the outage


def test_failures_a_restart_does_not_explain_are_raised_at_once() -> None:
    health = Health(timeout=30)
    inner = FlakyPlane([NotFound("no such path")])
    plane = RetryingPlane(inner, health)
    with pytest.raises(NotFound):
        plane.stat("r", "main", "f")
    assert inner.calls == 1
    assert health.retries == 0 and health.outages == 0
    assert not is_transient(BadRequest("bad"))
    assert not is_transient(ServerGone("gone"))


def test_server_gone_once_the_outage_outlasts_the_timeout() -> None:
    health = Health(timeout=0.3)
    inner = Down()
    plane = RetryingPlane(inner, health)
    t0 = time.monotonic()
    with pytest.raises(ServerGone) as info:
        plane.stat("r", "main", "f")
    assert 0.3 <= time.monotonic() - t0 < 2.0
    assert isinstance(info.value.__cause__, httpx.ConnectError)
    assert inner.calls > 1
    assert health.outages == 1


def test_the_outage_is_shared_between_calls_and_planes() -> None:
    health = Health(timeout=0.3)
    down = Down()
    with pytest.raises(ServerGone):
        RetryingPlane(down, health).stat("r", "main", "f")
    # Another caller during the same outage fails after one quick try, not another timeout.
    other = Down()
    t0 = time.monotonic()
    with pytest.raises(ServerGone):
        RetryingPlane(other, health).stat("r", "main", "g")
    assert other.calls == 1
    assert time.monotonic() - t0 < 0.2
    assert health.outages == 1
    # The first call that gets through ends the outage for everyone.
    assert RetryingPlane(FlakyPlane(), health).stat("r", "main", "h") == "r@main:h"
    assert health.down_since is None
    flaky = FlakyPlane([Unavailable("restarting")])
    assert RetryingPlane(flaky, health).stat("r", "main", "i") == "r@main:i"
    assert flaky.calls == 2
    assert health.outages == 2


def test_an_iterator_is_retried_only_as_a_unit_the_caller_names() -> None:
    health = Health(timeout=30)
    inner = FlakyPlane(walk_failures=1)
    plane = RetryingPlane(inner, health)
    with pytest.raises(Unavailable):
        list(plane.walk("r", "main", "d/"))  # the call created the iterator; its consumption is not retried
    inner.walk_failures = 1
    assert plane.retried(lambda p: list(p.walk("r", "main", "d/"))) == ["d/a", "d/b"]
    assert inner.walks == 3
    assert health.retries == 1


def test_a_unit_that_keeps_failing_ends_in_server_gone() -> None:
    """Creating the iterator answers at once every time: that must not end the outage."""
    health = Health(timeout=0.3)
    inner = FlakyPlane(walk_failures=1_000_000)
    plane = RetryingPlane(inner, health)
    with pytest.raises(ServerGone):
        plane.retried(lambda p: list(p.walk("r", "main", "d/")))
    assert inner.walks > 1
    assert health.outages == 1


def test_attributes_pass_through_unchanged() -> None:
    inner = FlakyPlane()
    plane = RetryingPlane(inner, Health(timeout=30))
    assert plane.url == "http://stub"
    assert plane.inner is inner
