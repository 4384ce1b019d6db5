"""HintedEntries: a job's next hint on the same tree is checked without looking its paths up again."""

from __future__ import annotations

import pytest

from fabric.errors import InvalidPath, NotFound
from fabric.format.model import DIR, Entry
from fabric.plane.reads import HintedEntries

FILES = {f"d/f{i}.bin": Entry(size=i + 1) for i in range(10)}


class Lookups:
    """A tree's paths, counting each lookup."""

    def __init__(self, entries: dict[str, Entry]) -> None:
        self.entries, self.asked = entries, []

    def __call__(self, path: str) -> Entry | None:
        self.asked.append(path)
        return self.entries.get(path)


def test_the_next_hint_on_a_tree_looks_up_only_paths_it_has_not_seen() -> None:
    memo, lookup = HintedEntries(), Lookups({**FILES, "d": Entry(kind=DIR)})
    paths = sorted(FILES)
    assert memo.check("repo", "main", paths[:6], "job", lookup, "tree1") == {p: FILES[p] for p in paths[:6]}
    assert lookup.asked == paths[:6]
    lookup.asked.clear()
    again = memo.check("repo", "main", paths[::-1], "job2", lookup, "tree1")  # another job, the same tree
    assert again == FILES and lookup.asked == paths[6:][::-1]
    lookup.asked.clear()
    # Another tree, another repository with the same tree id, and a view that can change: looked up.
    memo.check("repo", "main", paths, "job", lookup, "tree2")
    memo.check("other", "main", paths, "job", lookup, "tree1")
    memo.check("repo", "main", paths, "job", lookup, None)
    memo.check("repo", "main", paths, "job", lookup, None)
    assert lookup.asked == paths * 4


def test_a_bad_hint_is_refused_as_before_however_much_is_known() -> None:
    memo, lookup = HintedEntries(), Lookups({**FILES, "d": Entry(kind=DIR)})
    paths = sorted(FILES)
    memo.check("repo", "main", paths, "job", lookup, "tree1")
    with pytest.raises(NotFound, match="not found"):
        memo.check("repo", "main", [*paths, "d/missing.bin"], "job", lookup, "tree1")
    with pytest.raises(NotFound, match="not a file"):
        memo.check("repo", "main", [*paths, "d"], "job", lookup, "tree1")
    with pytest.raises(InvalidPath):
        memo.check("repo", "main", [*paths, "../x"], "job", lookup, "tree1")
    lookup.asked.clear()
    memo.check("repo", "main", paths, "job", lookup, "tree1")
    assert lookup.asked == []  # what the refused hints named was not kept


def test_what_is_kept_stays_within_its_bound_least_recent_tree_first() -> None:
    memo, lookup = HintedEntries(max_paths=12), Lookups(FILES)
    paths = sorted(FILES)
    memo.check("repo", "main", paths[:5], "job", lookup, "a")
    memo.check("repo", "main", paths[:5], "job", lookup, "b")
    memo.check("repo", "main", paths[:1], "job", lookup, "a")  # a: hinted most recently
    memo.check("repo", "main", paths[:4], "job", lookup, "c")  # 14 > 12: b goes
    lookup.asked.clear()
    for tree in ("a", "c", "b"):
        memo.check("repo", "main", paths[:4], "job", lookup, tree)
    assert lookup.asked == paths[:4]  # only b's
    big = HintedEntries(max_paths=4)
    big.check("repo", "main", paths, "job", lookup, "t")  # longer than the bound: its first 4 kept
    lookup.asked.clear()
    big.check("repo", "main", paths, "job", lookup, "t")
    assert lookup.asked == paths[4:]
