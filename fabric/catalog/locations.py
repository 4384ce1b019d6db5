"""The LocationConstraint each S3 bucket was created with, in the hub's catalog.

Every hub process on one catalog answers GetBucketLocation alike. The same interface as
the gateway's own file (:class:`fabric.api.s3.locations.BucketLocations`, a spoke's):
an entry is keyed by bucket name and creation time, so a bucket deleted and re-created
another way does not inherit a location. :meth:`Catalog.delete_bucket
<fabric.catalog.catalog.Catalog.delete_bucket>` drops the entry with the binding.
"""

from __future__ import annotations

from fabric.catalog.db import Database


class LocationStore:
    """Bucket locations in ``db``, a catalog's database (:class:`~fabric.catalog.catalog.Catalog`
    created the table when it opened it)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def get(self, bucket: str, created: float) -> str | None:
        """The constraint bucket ``bucket`` (created at ``created``) was created with, if any."""
        rows = self.db.query("SELECT location FROM bucket_locations WHERE name = ? AND created = ?", (bucket, created))
        return rows[0][0] if rows else None

    def put(self, bucket: str, created: float, constraint: str) -> None:
        with self.db.tx() as cur:
            cur.execute(
                "INSERT INTO bucket_locations (name, created, location) VALUES (?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET created = excluded.created, location = excluded.location",
                (bucket, created, constraint),
            )

    def drop(self, bucket: str) -> None:
        with self.db.tx() as cur:
            cur.execute("DELETE FROM bucket_locations WHERE name = ?", (bucket,))
