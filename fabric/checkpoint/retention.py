"""Which checkpoints a run keeps: the last N, every K-th step, and every one tagged by hand."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Retention:
    """``keep_last``: the newest N steps (at least 1, so the latest is never dropped);
    ``keep_every``: every step that is a multiple of K (None: none); ``keep_tagged``: every
    step whose commit also carries a tag of its own (e.g. ``fabric tag REPO best COMMIT``)."""

    keep_last: int = 3
    keep_every: int | None = None
    keep_tagged: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.keep_last, int) or isinstance(self.keep_last, bool) or self.keep_last < 1:
            raise ValueError(f"keep_last must be an integer of at least 1, not {self.keep_last!r}")
        if self.keep_every is not None and (
            not isinstance(self.keep_every, int) or isinstance(self.keep_every, bool) or self.keep_every < 1
        ):
            raise ValueError(f"keep_every must be None or an integer of at least 1, not {self.keep_every!r}")

    def kept(self, steps: Iterable[int], tagged: Iterable[int] = ()) -> set[int]:
        """The steps of ``steps`` this policy keeps; ``tagged`` are those tagged by hand."""
        steps = sorted(set(steps))
        keep = set(steps[-self.keep_last :])
        if self.keep_every is not None:
            keep.update(s for s in steps if s % self.keep_every == 0)
        if self.keep_tagged:
            keep.update(set(tagged) & set(steps))
        return keep
