"""The S3 bucket bindings role of the data plane.

A bucket name bound to one branch or tag of a repository; the S3 gateway
serves it with plain keys. Every other bucket name is a repository whose
keys are REF/PATH. Bindings are dicts ``{name, repo, ref, created,
created_by_s3}``; a binding goes when its repository is deleted. Bindings
are kept at the hub; a spoke reuses answers of :meth:`Buckets.get_bucket`
for up to 30 seconds (it forgets them at once when it changes one itself).
"""

from __future__ import annotations

import abc


class Buckets(abc.ABC):
    @abc.abstractmethod
    def list_buckets(self) -> list[dict]:
        """Every bucket binding, by name.

        Over HTTP, those of repositories the caller may read. Read-only, safe to retry."""

    @abc.abstractmethod
    def get_bucket(self, name: str) -> dict:
        """The binding of bucket ``name``; NotFound if the name is not bound.

        Safe to retry."""

    @abc.abstractmethod
    def create_bucket(
        self, name: str, repo: str, ref: str, created_by_s3: bool = False, owner: str | None = None
    ) -> dict:
        """Bind bucket ``name`` to a branch or tag of ``repo``; Conflict if the name is taken
        (by a binding, or by another repository). ``owner``: the id of the token that asked
        (passed on by a spoke, like :meth:`Repositories.create_repo`'s).

        Returns the new binding. ``ref`` is a branch or tag name, not an expression.
        Raises InvalidName for a bad name, NotFound if ``repo`` does not exist or
        ``ref`` is not one of its branches or tags. Not idempotent: a retry of a call
        that did land answers Conflict."""

    @abc.abstractmethod
    def delete_bucket(self, name: str) -> None:
        """Remove a binding (the repository stays); NotFound if the name is not bound.

        Not idempotent: a retry of a call that did land answers NotFound."""
