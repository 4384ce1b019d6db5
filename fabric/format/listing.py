"""Result types shared by every data plane: listings and changes."""

from __future__ import annotations

from dataclasses import dataclass, field

from fabric.format.model import Entry


@dataclass(frozen=True)
class Change:
    path: str
    kind: str  # added | removed | changed
    left: Entry | None
    right: Entry | None

    def describe(self) -> dict:
        d: dict = {"path": self.path, "type": self.kind}
        if self.right is not None:
            d["size"] = self.right.size
        elif self.left is not None:
            d["size"] = self.left.size
        return d


@dataclass
class Listing:
    entries: list[tuple[str, Entry]] = field(default_factory=list)
    prefixes: list[str] = field(default_factory=list)
    next_after: str | None = None  # pass back as ``after`` to continue


def change_kind(left: Entry | None, right: Entry | None) -> str:
    return "added" if left is None else "removed" if right is None else "changed"
