"""Repositories and bucket bindings created at a spoke on behalf of its callers.

The frontends pass the caller's token id as ``owner``; the SpokePlane forwards
it to the hub, which grants the caller the new repository. The caller's roles
have then changed, so :class:`CreatorAware` has the spoke forget what it
remembered of them (token verdicts, S3 signing keys): its next request is
checked with the hub again and may use the new repository at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fabric.plane.wrapper import PlaneWrapper

from .plane import SpokePlane


class CreatorAware(PlaneWrapper):
    """The SpokePlane as the spoke's frontends see it."""

    def __init__(self, plane: SpokePlane, forget: Sequence[Callable[[str], None]]) -> None:
        super().__init__(plane)
        self._forget = list(forget)

    def create_repo(self, name: str, default_branch: str = "main", owner: str | None = None) -> dict:
        info = self.inner.create_repo(name, default_branch, owner=owner)
        if owner is not None:
            for forget in self._forget:
                forget(owner)
        return info
