"""The S3 gateway: an ASGI app that serves every repository as an S3 bucket.

Path-style only: ``/BUCKET/KEY``. A bucket is either a repository, whose keys
are ``REF/PATH`` (a branch, tag or commit id, then the path), or a *bound*
bucket (``fabric bucket create NAME REPO@REF``, or S3 CreateBucket) whose keys
are plain paths on one branch or tag.

The gateway is thin: it translates S3 to :class:`~fabric.plane.dataplane.DataPlane`
calls and never touches a catalog or a pack store, so the hub and every spoke
serve it unchanged over their own plane. It needs three things from its host:

- ``plane``: the data plane;
- ``credentials(access_key_id) -> (Principal, secret)``: raises for an unknown
  key (fabric tokens double as S3 key pairs); ``None`` turns authentication off;
- ``buckets(name) -> dict | None``: the binding of a bucket name
  (``{name, repo, ref, created, created_by_s3}``), ``None`` when the name is
  not bound (it may still be a repository). Default: ``plane.get_bucket``,
  cached for a few seconds.

Multipart state lives in ``uploads`` (the hub passes one in its catalog, so every
hub process serves every upload) or, by default, in ``state_dir`` (SQLite); bucket
locations likewise in ``locations`` or a file in ``state_dir``. Objects written over S3 land
in the branch's staging area and are committed through REST/CLI, or by the
gateway itself with ``autocommit`` (``0``: after every write; ``N``: every N
seconds for branches written to).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from fabric.api.s3.auth import Authenticator, CredentialLookup
from fabric.api.s3.autocommit import AutoCommitter
from fabric.api.s3.buckets import BucketHandlers
from fabric.api.s3.dispatch import Dispatcher
from fabric.api.s3.listing import Listing
from fabric.api.s3.locations import BucketLocations, Locations
from fabric.api.s3.multipart import Uploads
from fabric.api.s3.multipart_handlers import MultipartHandlers
from fabric.api.s3.namespace import BindingLookup, Namespace, plane_bindings
from fabric.api.s3.objects import ObjectHandlers
from fabric.api.s3.transport import AsgiTransport, GatewayStats
from fabric.catalog.uploads import UploadStore
from fabric.plane.dataplane import DataPlane


class S3Gateway:
    """The gateway assembled: an ASGI app (:mod:`~fabric.api.s3.transport`) whose requests are
    authenticated (:mod:`~fabric.api.s3.auth`) and routed (:mod:`~fabric.api.s3.dispatch`) to
    the bucket, listing, object and multipart operations."""

    def __init__(
        self,
        plane: DataPlane,
        credentials: CredentialLookup | None,
        buckets: BindingLookup | None = None,
        state_dir: str = ".fabric/s3",
        autocommit: float | None = None,
        region: str = "us-east-1",
        cache_seconds: float = 2.0,
        access_log_enabled: bool = True,
        workers: int = 32,
        upload_expiry: float = 7 * 24 * 3600.0,
        uploads: UploadStore | None = None,
        locations: Locations | None = None,
    ) -> None:
        self.plane = plane
        self.uploads = uploads if uploads is not None else Uploads(state_dir)
        self.autocommit = AutoCommitter(plane, autocommit) if autocommit is not None else None
        self.stats = GatewayStats()
        namespace = Namespace(plane, buckets or plane_bindings(plane), cache_seconds)
        objects = ObjectHandlers(plane, namespace, self.stats, self.autocommit)
        self.multipart = MultipartHandlers(plane, namespace, objects, self.uploads, self.stats, upload_expiry)
        dispatcher = Dispatcher(
            Authenticator(credentials),
            namespace,
            self.stats,
            BucketHandlers(plane, namespace, region, locations if locations is not None else BucketLocations(state_dir)),
            Listing(plane),
            objects,
            self.multipart,
        )
        #: Plane calls block (SQLite, disk): they run here, never on the event loop.
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="s3-gateway")
        self._transport = AsgiTransport(dispatcher.handle, self._pool, self.stats, self.close, access_log_enabled)

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        await self._transport(scope, receive, send)

    def maintain_uploads(self, now: float | None = None) -> dict:
        """See :meth:`MultipartHandlers.maintain_uploads`."""
        return self.multipart.maintain_uploads(now)

    def close(self) -> None:
        self.multipart.close()
        if self.autocommit is not None:
            self.autocommit.close()
        self.uploads.close()
        self._pool.shutdown(wait=False)
