"""A mount's cached listings (fuse/namespace.py) against changes made while one loads."""

from __future__ import annotations

import io
import threading

from fabric.format.model import DIR, FILE, Entry
from fabric.plane.retry import Health, RetryingPlane
from fabric.plane.wrapper import PlaneWrapper
from fuse.namespace import Namespace

IMPLICIT = Entry(DIR, 0, 0o755, 0)


class GatedPlane(PlaneWrapper):
    """Holds each ``list`` after the engine answered, until the test opens the gate."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.answered = threading.Event()
        self.gate = threading.Event()
        self.lists = 0

    def list(self, *args, **kwargs):
        page = self.inner.list(*args, **kwargs)
        self.lists += 1
        self.answered.set()
        assert self.gate.wait(10)
        return page


def _namespace_of(sqlite_engine) -> tuple[Namespace, GatedPlane]:
    sqlite_engine.create_repo("names")
    sqlite_engine.put_object("names", "main", "old.txt", io.BytesIO(b"committed before\n"))
    plane = GatedPlane(sqlite_engine)
    return Namespace(RetryingPlane(plane, Health(5)), "names", "main", IMPLICIT, ttl=60), plane


def _loading(ns: Namespace, plane: GatedPlane) -> tuple[threading.Thread, list]:
    got: list = []
    t = threading.Thread(target=lambda: got.append(ns.dir("")))
    t.start()
    assert plane.answered.wait(10)
    return t, got


def test_an_entry_changed_through_the_mount_while_its_listing_loads_is_in_what_the_load_returns_and_keeps(sqlite_engine):
    """The server answered before the mount staged a new version of ``old.txt`` and before it
    created ``new.txt``: the listing returned (and cached) shows both, not the older answer
    (a stat of the file then gave the kernel the old size, and a read stopped short)."""
    ns, plane = _namespace_of(sqlite_engine)
    t, got = _loading(ns, plane)
    staged = Entry(FILE, 18, 0o644, 1)
    ns.update("old.txt", staged)
    ns.update("new.txt", Entry(FILE, 3, 0o644, 1))
    plane.gate.set()
    t.join(10)
    assert got[0].children["old.txt"] is staged
    assert sorted(got[0].children) == ["new.txt", "old.txt"]
    assert ns.lookup("old.txt") is staged
    assert plane.lists == 1  # (kept: no second listing)


def test_an_entry_removed_through_the_mount_while_its_listing_loads_stays_removed(sqlite_engine):
    ns, plane = _namespace_of(sqlite_engine)
    t, got = _loading(ns, plane)
    ns.update("old.txt", None)
    plane.gate.set()
    t.join(10)
    assert "old.txt" not in got[0].children
    assert ns.lookup("old.txt") is None


def test_a_listing_forgotten_while_it_loads_is_listed_again(sqlite_engine):
    """An invalidation (the directory changed elsewhere) during a load: the answer may predate
    that change, so the directory is listed again and the second answer shows it."""
    ns, plane = _namespace_of(sqlite_engine)
    t, got = _loading(ns, plane)
    sqlite_engine.put_object("names", "main", "elsewhere.txt", io.BytesIO(b"x"))
    ns.invalidate("")
    plane.gate.set()
    t.join(10)
    assert plane.lists == 2
    assert sorted(got[0].children) == ["elsewhere.txt", "old.txt"]
    assert ns.lookup("elsewhere.txt") is not None and plane.lists == 2  # (the second answer is kept)
