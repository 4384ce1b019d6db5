"""Read plans: which blobs will be read soon, and in which order (for :class:`~fabric.cache.disk.DiskCache`).

A plan is an ordered list of ids that one reader (a job, a hint) will read, named
by its owner; setting a plan of a name replaces the previous one. Reads move a
plan's *cursor*: a read of the id at place ``q`` of a plan consumes that place
and, when ``q`` is at most :data:`PLAN_SKIP` places past the cursor's
:data:`PLAN_LAG`, every place more than :data:`PLAN_LAG` places before it too (the
reader went past them). The last :data:`PLAN_LAG` places stay planned because a
reader may have several files open at once, each read in order (a DataLoader's
workers): a read of the next file must not release the chunks of the one still
being read. A read further ahead consumes only its own place, so one stray read
does not throw the rest of a plan away.
An id listed twice is planned until its last place is consumed.

An id's *distance* is how many places ahead of the cursor its next place is, the
smallest over the plans that list it; the cache evicts the planned blob of the
largest distance first (:meth:`Plans.victim`). With several plans the victim is
chosen among each plan's farthest cached id.

Memory is bounded: all plans together hold at most :data:`PLAN_MAX_IDS` places
(a longer plan keeps its first ones, the soonest) and at most :data:`PLAN_MAX`
plans are kept; the least recently set or advanced plan is dropped first.
Not thread-safe: the cache calls it under its lock.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence

#: Places kept in all plans together (about 100 bytes each).
PLAN_MAX_IDS = 131_072
#: Plans kept at once.
PLAN_MAX = 64
#: A read at most this many places past the lag ahead of a plan's cursor moves the cursor.
PLAN_SKIP = 1024
#: Places before a read that stay planned when the cursor moves (256 MiB of 64 KiB chunks:
#: what a DataLoader's workers have in flight, several large files each).
PLAN_LAG = 4096


class _Plan:
    __slots__ = ("order", "later", "first", "cursor", "high")

    def __init__(self, ids: Sequence[bytes]) -> None:
        self.order = list(ids)
        #: For each place, the next place of the same id (-1: none).
        self.later = array("q", [-1]) * len(self.order)
        #: Each planned id's next unconsumed place.
        self.first: dict[bytes, int] = {}
        for i in range(len(self.order) - 1, -1, -1):
            key = self.order[i]
            self.later[i] = self.first.get(key, -1)
            self.first[key] = i
        self.cursor = 0
        #: No cached id of this plan has its next place after ``high`` (where a victim search starts).
        self.high = -1


class Plans:
    def __init__(self) -> None:
        self._plans: OrderedDict[str, _Plan] = OrderedDict()
        #: How many plans list each planned id.
        self._count: dict[bytes, int] = {}
        self._places = 0

    def __bool__(self) -> bool:
        return bool(self._plans)

    def planned(self, key: bytes) -> bool:
        return key in self._count

    def names(self) -> list[str]:
        return list(self._plans)

    def places(self) -> int:
        """Places held by all plans together (bounded by :data:`PLAN_MAX_IDS`)."""
        return self._places

    def set(self, name: str, ids: Sequence[bytes]) -> tuple[list[bytes], list[bytes]]:
        """Replace the plan ``name`` by ``ids`` (none: drop it). Returns the ids now planned
        and the ids no longer planned by any plan."""
        released = self.drop(name)
        if not ids:
            return [], released
        plan = _Plan(ids[:PLAN_MAX_IDS])
        while self._plans and self._places + len(plan.order) > PLAN_MAX_IDS or len(self._plans) >= PLAN_MAX:
            released += self.drop(next(iter(self._plans)))
        self._plans[name] = plan
        self._places += len(plan.order)
        for key in plan.first:
            self._count[key] = self._count.get(key, 0) + 1
        fresh = set(plan.first)
        return list(plan.first), [k for k in dict.fromkeys(released) if k not in fresh]

    def drop(self, name: str) -> list[bytes]:
        """Forget the plan ``name``; the ids no longer planned by any plan."""
        plan = self._plans.pop(name, None)
        if plan is None:
            return []
        self._places -= len(plan.order)
        return [key for key in plan.first if self._uncount(key)]

    def consume(self, key: bytes) -> list[bytes]:
        """A read of ``key``: consume its place in each plan; the ids no longer planned."""
        if key not in self._count:  # listed by no plan (at any unconsumed place): nothing moves
            return []
        released: list[bytes] = []
        for name, plan in list(self._plans.items()):
            place = plan.first.get(key)
            if place is None:
                continue
            self._plans.move_to_end(name)
            self._pass(plan, place, released)
            if place - plan.cursor <= PLAN_SKIP + PLAN_LAG:
                passed = place - PLAN_LAG
                for i in range(plan.cursor, passed):
                    self._pass(plan, i, released)
                if passed > plan.cursor:
                    plan.cursor = passed
                    plan.high = max(plan.high, plan.cursor - 1)
        return released

    def noted(self, key: bytes) -> None:
        """``key`` is cached now: a victim search must see it."""
        for plan in self._plans.values():
            place = plan.first.get(key)
            if place is not None and place > plan.high:
                plan.high = place

    def distance(self, key: bytes) -> int | None:
        """How many places ahead ``key`` will be read (the nearest plan); None if unplanned."""
        best = None
        for plan in self._plans.values():
            place = plan.first.get(key)
            if place is not None and (best is None or place - plan.cursor < best):
                best = place - plan.cursor
        return best

    def victim(self, cached: Callable[[bytes], bool]) -> bytes | None:
        """The cached planned id to be read last (among each plan's farthest cached one)."""
        best_key, best = None, -1
        for plan in self._plans.values():
            i = plan.high
            while i >= plan.cursor:
                key = plan.order[i]
                if plan.first.get(key) == i and cached(key):
                    break
                i -= 1
            plan.high = i
            if i < plan.cursor:
                continue
            key = plan.order[i]
            far = self.distance(key)
            if far is not None and far > best:
                best_key, best = key, far
        return best_key

    # -- internals -----------------------------------------------------------
    def _pass(self, plan: _Plan, i: int, released: list[bytes]) -> None:
        """The reader is past place ``i`` of ``plan``."""
        key = plan.order[i]
        if plan.first.get(key) != i:
            return  # consumed before (a read ahead), or not this id's next place
        nxt = plan.later[i]
        if nxt >= 0:
            plan.first[key] = nxt
            return
        del plan.first[key]
        if self._uncount(key):
            released.append(key)

    def _uncount(self, key: bytes) -> bool:
        left = self._count[key] - 1
        if left:
            self._count[key] = left
            return False
        del self._count[key]
        return True
