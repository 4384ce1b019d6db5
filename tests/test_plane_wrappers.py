"""Decorators around a data plane: PlaneWrapper's delegation, MetricsPlane's counts and latency.

Unit tests use a small stub plane; one test reads through a real spoke of a
real hub and finds the read in the spoke's ``/metrics`` upstream counters.
"""

from __future__ import annotations

import io

import httpx
import pytest
from prometheus_client import CollectorRegistry

from fabric.errors import NotFound
from fabric.plane.metrics import MetricsPlane
from fabric.plane.wrapper import PlaneWrapper
from tests.hubserver import Hub, metric_value, unique_name
from tests.spokeserver import Spoke


class StubPlane:
    """Two operations, one that answers and one that fails, and two plain attributes."""

    url = "http://stub"

    def __init__(self) -> None:
        self._secret = "private"
        self.calls: list[tuple] = []

    def get_repo(self, name: str) -> dict:
        self.calls.append(("get_repo", name))
        return {"name": name}

    def delete_repo(self, name: str) -> None:
        self.calls.append(("delete_repo", name))
        raise NotFound(f"repository {name!r} does not exist")


class Recording(PlaneWrapper):
    """Records the name of each call it passes on."""

    def __init__(self, inner: object) -> None:
        super().__init__(inner)
        self.seen: list[str] = []

    def around(self, name, call, args, kwargs):
        self.seen.append(name)
        return super().around(name, call, args, kwargs)


def test_wrapper_passes_method_calls_through_around_and_attributes_unchanged() -> None:
    inner = StubPlane()
    plane = Recording(inner)
    assert plane.get_repo("r") == {"name": "r"}
    assert plane.get_repo(name="s") == {"name": "s"}
    with pytest.raises(NotFound):
        plane.delete_repo("gone")
    assert plane.seen == ["get_repo", "get_repo", "delete_repo"]
    assert inner.calls == [("get_repo", "r"), ("get_repo", "s"), ("delete_repo", "gone")]
    assert plane.url == "http://stub" and plane._secret == "private" and plane.calls is inner.calls
    assert plane.seen == ["get_repo", "get_repo", "delete_repo"]  # attributes are not calls
    assert plane.get_repo is plane.get_repo  # wrapped once, then reused
    with pytest.raises(AttributeError):
        plane.no_such_method  # noqa: B018 - the lookup is the test


def test_metrics_plane_counts_calls_and_latency_by_operation_and_outcome() -> None:
    registry = CollectorRegistry()
    plane = MetricsPlane(StubPlane(), registry, "fabric_test")
    for _ in range(3):
        plane.get_repo("r")
    with pytest.raises(NotFound) as raised:
        plane.delete_repo("gone")
    assert raised.value.message == "repository 'gone' does not exist"  # re-raised unchanged

    def sample(name: str, op: str, outcome: str) -> float | None:
        return registry.get_sample_value(name, {"op": op, "outcome": outcome})

    assert sample("fabric_test_calls_total", "get_repo", "ok") == 3
    assert sample("fabric_test_calls_total", "delete_repo", "NotFound") == 1
    assert sample("fabric_test_calls_total", "delete_repo", "ok") is None
    assert sample("fabric_test_call_seconds_count", "get_repo", "ok") == 3
    assert sample("fabric_test_call_seconds_count", "delete_repo", "NotFound") == 1
    assert sample("fabric_test_call_seconds_sum", "get_repo", "ok") >= 0


def test_two_metrics_planes_keep_separate_registries() -> None:
    first, second = CollectorRegistry(), CollectorRegistry()
    MetricsPlane(StubPlane(), first, "fabric_test").get_repo("r")
    MetricsPlane(StubPlane(), second, "fabric_test")
    labels = {"op": "get_repo", "outcome": "ok"}
    assert first.get_sample_value("fabric_test_calls_total", labels) == 1
    assert second.get_sample_value("fabric_test_calls_total", labels) is None


def test_a_read_through_a_spoke_shows_in_its_upstream_metrics(hub: Hub, cold_spoke_of_hub: Spoke) -> None:
    spoke = cold_spoke_of_hub
    repo = unique_name("metrics")
    data = b"counted upstream " * 4096
    plane = hub.plane()
    plane.create_repo(repo)
    plane.put_object(repo, "main", "data.bin", io.BytesIO(data))
    plane.commit(repo, "main", "data")

    def upstream(op: str) -> float:
        text = httpx.get(spoke.url + "/metrics", timeout=30).text
        return metric_value(text, "fabric_upstream_calls_total", op=op, outcome="ok")

    before = upstream("frames")
    assert spoke.plane().read(repo, "main", "data.bin") == data  # a cold cache: chunks come from the hub
    assert upstream("frames") > before
    text = httpx.get(spoke.url + "/metrics", timeout=30).text
    assert metric_value(text, "fabric_upstream_call_seconds_count", op="frames", outcome="ok") > 0
