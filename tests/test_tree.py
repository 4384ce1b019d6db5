"""Range trees over a MetaStore: build, read, apply, diff, structural sharing."""

from __future__ import annotations

import hashlib
import itertools
import random
from typing import Any

import pytest

from fabric.engine.metastore import METARANGE, RANGE, MetaStore
from fabric.engine.tree import METARANGES_KEPT, RANGE_MAX, Trees, is_boundary
from fabric.format.model import DIR, SYMLINK, Entry
from fabric.store import LocalStore


class CountingMetaStore(MetaStore):
    """A real MetaStore that counts reads by kind (a test instrument)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gets: dict[bytes, int] = {RANGE: 0, METARANGE: 0}

    def get(self, kind: bytes, oid: str) -> Any:
        self.gets[kind] = self.gets.get(kind, 0) + 1
        return super().get(kind, oid)

    def reset(self) -> None:
        self.gets = {RANGE: 0, METARANGE: 0}


@pytest.fixture
def store(tmp_path) -> LocalStore:
    return LocalStore(tmp_path / "objects")


@pytest.fixture
def trees(store: LocalStore) -> Trees:
    return Trees(MetaStore(store))


def ent(i: int, version: int = 0) -> Entry:
    """A file entry with a fake chunk id (no bytes behind it; trees never read chunks)."""
    cid = hashlib.blake2b(f"{i}/{version}".encode(), digest_size=32).digest()
    return Entry(size=i + version, mtime_ns=version, md5=f"{i:08x}{version:024x}", chunks=((cid, i + version),))


def build(trees: Trees, items: dict[str, Entry]) -> str:
    return trees.build(iter(sorted(items.items())))


def as_dict(trees: Trees, tree_id: str) -> dict[str, Entry]:
    return dict(trees.iter(tree_id))


def range_ids(trees: Trees, tree_id: str) -> list[str]:
    return [r.id for r in trees.ranges(tree_id)]


def sample_items(n: int, seed: int = 0) -> dict[str, Entry]:
    rnd = random.Random(seed)
    out: dict[str, Entry] = {}
    while len(out) < n:
        i = rnd.randrange(10 * n)
        out[f"d{i % 17:02d}/sub{i % 5}/f-{i:07d}.dat"] = ent(i)
    return out


# -- build / get / iter ------------------------------------------------------


def test_empty_tree(trees: Trees) -> None:
    assert build(trees, {}) == trees.empty
    assert trees.ranges(trees.empty) == []
    assert list(trees.iter(trees.empty)) == []
    assert trees.get(trees.empty, "a") is None
    assert list(trees.diff(trees.empty, trees.empty)) == []
    assert trees.apply(trees.empty, {}) == trees.empty
    assert trees.apply(trees.empty, {"x": None}) == trees.empty


def test_build_get_iter(trees: Trees) -> None:
    items = sample_items(5000, 1)
    items["top"] = Entry(kind=DIR, mode=0o755)
    items["link"] = Entry(kind=SYMLINK, target="top")
    tid = build(trees, items)
    refs = trees.ranges(tid)
    assert len(refs) > 3  # cut into several ranges
    assert sum(r.count for r in refs) == len(items)
    for a, b in itertools.pairwise(refs):
        assert a.last < b.first
    assert list(trees.iter(tid)) == sorted(items.items())
    for path in random.Random(2).sample(sorted(items), 300):
        assert trees.get(tid, path) == items[path]
    assert trees.get(tid, "link").target == "top"
    for missing in ["", "a", "d00", "d00/sub0/f-", "zzz", "d05/sub9/x", sorted(items)[10] + "0"]:
        assert trees.get(tid, missing) is None


def test_build_is_deterministic_and_content_addressed(store: LocalStore) -> None:
    items = sample_items(2000, 3)
    t1 = Trees(MetaStore(store))
    t2 = Trees(MetaStore(LocalStore(str(store.root) + "-other")))
    assert build(t1, items) == build(t2, items)
    changed = dict(items)
    changed[sorted(items)[7]] = ent(7, 1)
    assert build(t1, changed) != build(t1, items)


@pytest.mark.parametrize("prefix", ["", "d03/", "d03/sub2/", "d1", "d16/sub4/f-", "nothing/", "d03/sub2/f-0000"])
def test_iter_with_prefix(trees: Trees, prefix: str) -> None:
    items = sample_items(4000, 4)
    tid = build(trees, items)
    want = [(p, e) for p, e in sorted(items.items()) if p.startswith(prefix)]
    assert list(trees.iter(tid, prefix=prefix)) == want


def test_iter_with_start_and_prefix(trees: Trees) -> None:
    items = sample_items(3000, 5)
    tid = build(trees, items)
    paths = sorted(items)
    rnd = random.Random(6)
    starts = [rnd.choice(paths) for _ in range(20)] + ["", "d", "d05/sub3/f-00", "zz", paths[-1], paths[-1] + "x"]
    for start in starts:
        assert [p for p, _ in trees.iter(tid, start=start)] == [p for p in paths if p >= start]
        for prefix in ("d05/", "d05/sub3/", "d1"):
            got = [p for p, _ in trees.iter(tid, start=start, prefix=prefix)]
            assert got == [p for p in paths if p >= start and p.startswith(prefix)], (start, prefix)


def test_walk_ids(trees: Trees) -> None:
    tid = build(trees, sample_items(3000, 7))
    ids = list(trees.walk_ids(tid))
    assert ids[0] == ("metarange", tid)
    assert [i for k, i in ids[1:]] == range_ids(trees, tid)
    assert all(k == "range" for k, _ in ids[1:])


def test_boundaries_depend_on_paths_only(trees: Trees) -> None:
    items = sample_items(3000, 8)
    tid = build(trees, items)
    for ref in trees.ranges(tid)[:-1]:
        assert is_boundary(ref.last) or ref.count == RANGE_MAX
        inner = [p for p, _ in trees.iter(tid, start=ref.first) if p < ref.last]
        assert not any(is_boundary(p) for p in inner)


# -- apply == build ----------------------------------------------------------


def _random_changes(items: dict[str, Entry], rnd: random.Random, n: int) -> dict[str, Entry | None]:
    paths = sorted(items)
    changes: dict[str, Entry | None] = {}
    for _ in range(n):
        r = rnd.random()
        if r < 0.35 and paths:
            changes[rnd.choice(paths)] = None
        elif r < 0.7 and paths:
            p = rnd.choice(paths)
            changes[p] = items[p].with_(mtime_ns=rnd.randint(1, 10**9))
        else:
            changes[f"d{rnd.randint(0, 20):02d}/new/{rnd.randint(0, 10**6)}"] = ent(rnd.randint(0, 10**6), 5)
    # Also edges: before the first path and after the last.
    if rnd.random() < 0.5:
        changes["!first"] = ent(1, 9)
    if rnd.random() < 0.5:
        changes["~last"] = ent(2, 9)
    if rnd.random() < 0.3:
        changes["absent/deleted"] = None
    return changes


def _applied(items: dict[str, Entry], changes: dict[str, Entry | None]) -> dict[str, Entry]:
    out = dict(items)
    for p, e in changes.items():
        if e is None:
            out.pop(p, None)
        else:
            out[p] = e
    return out


@pytest.mark.parametrize("seed", range(8))
def test_apply_equals_build(trees: Trees, seed: int) -> None:
    rnd = random.Random(100 + seed)
    items = sample_items(rnd.choice([10, 600, 3000, 6000]), seed)
    tid = build(trees, items)
    for _ in range(3):
        changes = _random_changes(items, rnd, rnd.choice([1, 5, 50, 400]))
        new = trees.apply(tid, changes)
        items = _applied(items, changes)
        assert as_dict(trees, new) == items
        assert list(trees.iter(new)) == sorted(items.items())
        # Same content gives the same tree: apply is canonical (history-independent).
        assert new == build(trees, items)
        tid = new


def test_apply_deleting_everything_gives_the_empty_tree(trees: Trees) -> None:
    items = sample_items(2000, 9)
    tid = build(trees, items)
    assert trees.apply(tid, {p: None for p in items}) == trees.empty


def test_apply_to_empty_tree(trees: Trees) -> None:
    items = sample_items(1500, 10)
    assert trees.apply(trees.empty, dict(items)) == build(trees, items)


def test_apply_no_changes_is_identity(trees: Trees) -> None:
    items = sample_items(1000, 11)
    tid = build(trees, items)
    assert trees.apply(tid, {}) == tid
    assert trees.apply(tid, {"not/there": None}) == tid
    p = sorted(items)[123]
    assert trees.apply(tid, {p: items[p]}) == tid


def test_apply_without_content_boundaries_hits_the_range_cap(trees: Trees) -> None:
    """Paths that never hit a boundary: ranges are capped at RANGE_MAX; apply still equals build."""
    paths: list[str] = []
    i = 0
    while len(paths) < 2 * RANGE_MAX + 100:
        p = f"n/{i:07d}"
        if not is_boundary(p):
            paths.append(p)
        i += 1
    items = {p: ent(k) for k, p in enumerate(paths)}
    tid = build(trees, items)
    assert [r.count for r in trees.ranges(tid)] == [RANGE_MAX, RANGE_MAX, 100]
    changes: dict[str, Entry | None] = {paths[5]: None, paths[RANGE_MAX + 3]: ent(1, 1)}
    new = trees.apply(tid, changes)
    assert new == build(trees, _applied(items, changes))


# -- structural sharing and diff: 10 changes in 100,000 ----------------------


def _diff_paths(trees: Trees, a: str, b: str, prefix: str = "") -> list[str]:
    return [p for p, _, _ in trees.diff(a, b, prefix)]


def test_diff_small(trees: Trees) -> None:
    items = sample_items(3000, 12)
    tid = build(trees, items)
    paths = sorted(items)
    changes: dict[str, Entry | None] = {paths[0]: None, paths[1500]: ent(1, 1), "d03/zz-new": ent(2, 2)}
    new = trees.apply(tid, changes)
    got = list(trees.diff(tid, new))
    assert [p for p, _, _ in got] == sorted(changes)
    by_path = {p: (a, b) for p, a, b in got}
    assert by_path[paths[0]] == (items[paths[0]], None)
    assert by_path[paths[1500]] == (items[paths[1500]], ent(1, 1))
    assert by_path["d03/zz-new"] == (None, ent(2, 2))
    # Reverse direction swaps sides.
    assert [(p, b, a) for p, a, b in trees.diff(new, tid)] == got
    assert _diff_paths(trees, tid, new, prefix="d03/") == ["d03/zz-new"]
    assert list(trees.diff(tid, tid)) == []
    # Diff against the empty tree lists everything.
    assert _diff_paths(trees, trees.empty, tid) == paths


def test_diff_with_prefix_matches_brute_force(trees: Trees) -> None:
    rnd = random.Random(13)
    items = sample_items(5000, 13)
    tid = build(trees, items)
    changes = _random_changes(items, rnd, 200)
    new = trees.apply(tid, changes)
    after = _applied(items, changes)
    for prefix in ["", "d0", "d07/", "d07/sub1/", "d20/new/", "none/"]:
        want = sorted(
            p for p in items.keys() | after.keys() if p.startswith(prefix) and items.get(p) != after.get(p)
        )
        assert _diff_paths(trees, tid, new, prefix) == want, prefix


N_BIG = 100_000


def test_ten_changes_in_100k_share_all_but_a_handful_of_ranges(store: LocalStore) -> None:
    writer = Trees(MetaStore(store))
    paths = [f"train/shard-{i // 1000:03d}/sample-{i:06d}.bin" for i in range(N_BIG)]
    old_items = [(p, ent(i)) for i, p in enumerate(paths)]  # already sorted
    old = writer.build(iter(old_items))
    old_refs = writer.ranges(old)
    assert sum(r.count for r in old_refs) == N_BIG
    assert len(old_refs) > 100

    # 10 changes spread over the key space: 4 modified, 3 added, 3 deleted.
    changes: dict[str, Entry | None] = {
        paths[17]: ent(17, 1),
        paths[25_000]: ent(25_000, 1),
        paths[50_001]: ent(50_001, 1),
        paths[99_999]: ent(99_999, 1),
        "train/shard-010/sample-010500.bin.extra": ent(1, 7),
        "train/shard-070/zz-new.bin": ent(2, 7),
        "validation/new.bin": ent(3, 7),
        paths[3]: None,
        paths[60_000]: None,
        paths[88_888]: None,
    }
    assert len(changes) == 10

    counting = CountingMetaStore(store)
    trees = Trees(counting)  # fresh cache: every range read below goes to the store
    counting.reset()
    new = trees.apply(old, changes)
    apply_reads = counting.gets[RANGE]
    assert apply_reads <= 2 * len(changes) + 2, apply_reads

    new_refs = trees.ranges(new)
    old_ids, new_ids = {r.id for r in old_refs}, {r.id for r in new_refs}
    not_shared = len(old_ids - new_ids) + len(new_ids - old_ids)
    assert not_shared <= 2 * len(changes) + 2, not_shared
    assert len(old_ids & new_ids) >= len(old_ids) - len(changes)

    counting.reset()
    counting._cache.clear()
    trees = Trees(counting)  # nor any tree's list of ranges parsed yet
    diff = list(trees.diff(old, new))
    assert [p for p, _, _ in diff] == sorted(changes)
    for path, before, after in diff:
        assert after == changes[path]
        assert before == (dict(old_items).get(path) if before is not None else None)
    # Diff opens only the ranges that differ, not the ~200 in each tree.
    assert counting.gets[RANGE] == not_shared
    assert counting.gets[RANGE] <= 2 * len(changes) + 2
    assert counting.gets[METARANGE] == 2

    # And the result is exactly the tree built from scratch.
    expected = dict(old_items)
    expected.update({p: e for p, e in changes.items() if e is not None})
    for p, e in changes.items():
        if e is None:
            del expected[p]
    assert trees.build(iter(sorted(expected.items()))) == new


def test_diff_reads_scale_with_changes_not_size(store: LocalStore) -> None:
    """Doubling the tree does not change how many ranges a 3-path diff reads."""
    reads = []
    for n in (20_000, 40_000):
        counting = CountingMetaStore(store)
        trees = Trees(counting)
        base = trees.build((f"p/{i:06d}", ent(i)) for i in range(n))
        new = trees.apply(base, {f"p/{n // 3:06d}": None, f"p/{n // 2:06d}": ent(1, 1), "q": ent(2, 2)})
        counting._cache.clear()
        counting.reset()
        assert _diff_paths(trees, base, new) == sorted([f"p/{n // 3:06d}", f"p/{n // 2:06d}", "q"])
        reads.append(counting.gets[RANGE])
    assert reads[0] <= 8 and reads[1] <= 8, reads


def test_corrupt_range_object_is_detected(store: LocalStore, trees: Trees) -> None:
    from fabric.engine.metastore import object_key
    from fabric.errors import Corruption

    tid = build(trees, sample_items(2000, 14))
    rid = range_ids(trees, tid)[1]
    path = f"{store.root}/{object_key(rid)}"
    with open(path, "rb") as f:
        data = bytearray(f.read())
    data[-1] ^= 0xFF
    with open(path, "wb") as f:
        f.write(bytes(data))
    fresh = Trees(MetaStore(store))
    with pytest.raises(Corruption):
        list(fresh.iter(tid))


def test_a_trees_list_of_ranges_is_parsed_once_for_many_lookups(store: LocalStore) -> None:
    """Looking paths up reads a tree's metarange once, not once per path, and keeps at most
    METARANGES_KEPT trees parsed: the oldest is read again after that many others."""
    counting = CountingMetaStore(store)
    trees = Trees(counting)
    items = {f"d/{i:05d}": ent(i) for i in range(3000)}
    tree_id = build(trees, items)
    counting.reset()
    assert len(trees.ranges(tree_id)) > 1
    for path in list(items)[::10]:
        assert trees.get(tree_id, path) == items[path]
    assert trees.get(tree_id, "d/zzz") is None and trees.get(tree_id, "a") is None
    assert dict(trees.iter(tree_id)) == items
    assert counting.gets[METARANGE] == 1

    others = [build(trees, {f"o/{k}": ent(k)}) for k in range(METARANGES_KEPT)]
    for other in others:
        trees.get(other, "o/0")
    counting.reset()
    assert trees.get(tree_id, "d/00007") == items["d/00007"]
    assert counting.gets[METARANGE] == 1  # pushed out by the others: read again
