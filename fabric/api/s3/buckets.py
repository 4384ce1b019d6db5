"""S3 bucket operations: ListBuckets, Create/Head/DeleteBucket, the bucket configuration reads
(location, versioning) that clients ask for, and the ACL calls (:mod:`~fabric.api.s3.acl`)."""

from __future__ import annotations

import base64
import binascii

from fabric.api.s3 import xml as X
from fabric.api.s3.acl import NOTE_HEADER, PER_TOKEN, acl_document, check_owner_only
from fabric.api.s3.auth import require
from fabric.api.s3.bucketnames import check_bucket_name, repo_for_bucket
from fabric.api.s3.errors import S3Error, from_fabric
from fabric.api.s3.locations import BucketLocations, Locations, valid_constraint
from fabric.api.s3.namespace import Bucket, Namespace
from fabric.api.s3.request import Ctx, iso8601, owner_xml, xml_response
from fabric.api.s3.transport import Response
from fabric.auth.principal import CREATE_REPOS
from fabric.errors import FabricError, InvalidName, NotFound
from fabric.plane.dataplane import DataPlane

#: The region where re-creating a bucket you own answers 200 (elsewhere: BucketAlreadyOwnedByYou).
LEGACY_REGION = "us-east-1"
MAX_BUCKETS = 10000


class BucketHandlers:
    def __init__(
        self, plane: DataPlane, namespace: Namespace, region: str, locations: Locations | None = None
    ) -> None:
        self.plane = plane
        self.namespace = namespace
        self.region = region
        self.locations = locations if locations is not None else BucketLocations(None)

    def list_buckets(self, ctx: Ctx) -> Response:
        """Buckets the caller may read, by name; ``max-buckets``, ``continuation-token`` and
        ``prefix`` as in S3 (an empty token is no token)."""
        who = ctx.who
        prefix = ctx.q.get("prefix", "")
        limit = _max_buckets(ctx.q.get("max-buckets"))
        after = _token_name(ctx.q.get("continuation-token") or "")
        found: dict[str, float] = {}
        repos = {r["name"]: r for r in self.plane.list_repos()}
        for r in repos.values():
            if who.can(r["name"], "read"):
                found[r["name"]] = r.get("created", 0.0)
        for bd in self.plane.list_buckets():
            if bd["repo"] in repos and who.can(bd["repo"], "read"):
                found[bd["name"]] = bd.get("created", 0.0)
        names = [n for n in sorted(found) if n.startswith(prefix) and n > after]
        page = names[:limit] if limit is not None else names
        token = _token(page[-1]) if limit is not None and len(names) > limit else None
        items = [(n, iso8601(found[n])) for n in page]
        return xml_response(X.list_buckets(items, owner_xml(ctx), token, prefix if "prefix" in ctx.q else None))

    def create_bucket(self, ctx: Ctx, name: str) -> Response:
        check_bucket_name(name)
        constraint = X.parse_location(ctx.read_small(1 << 20)) or None
        if constraint is not None and not valid_constraint(constraint):
            raise S3Error(
                "InvalidLocationConstraint",
                "The specified location-constraint is not valid: a region name (letters, digits and '-', at most 64)",
                400,
            )
        existing = self.namespace.resolve_bucket(name)
        if existing is not None:
            if not ctx.who.can(existing.repo, "admin"):
                raise S3Error("BucketAlreadyExists", "The requested bucket name is not available.", 409, BucketName=name)
            if self._region_of(existing) == LEGACY_REGION and (constraint or self.region) == LEGACY_REGION:
                return Response(200, {"Location": f"/{name}"})
            raise S3Error(
                "BucketAlreadyOwnedByYou",
                "Your previous request to create the named bucket succeeded and you already own it.",
                409,
                BucketName=name,
            )
        if not ctx.who.has(CREATE_REPOS):
            raise S3Error(
                "AccessDenied",
                f"token {ctx.who.name!r} may not create buckets: that needs an administrator token or one created with "
                "`fabric token create --create-repos`",
                403,
            )
        binding = self._create(ctx, name)
        if constraint is not None:
            self.locations.put(name, binding.get("created", 0.0), constraint)
        self.namespace.forget(name)
        return Response(200, {"Location": f"/{name}"})

    def _create(self, ctx: Ctx, name: str) -> dict:
        """A repository and a binding of ``name`` to its default branch; the binding."""
        # The caller owns what it creates: the plane is told whose it is (the hub grants it, a spoke forwards it).
        owner = {} if ctx.who.token_id is None else {"owner": ctx.who.token_id}
        repo = repo_for_bucket(name, self._repo_taken)
        try:
            info = self.plane.create_repo(repo, **owner)
        except FabricError as exc:
            if exc.status == 409:
                raise S3Error("BucketAlreadyExists", "The requested bucket name is not available.", 409, BucketName=name) from None
            raise from_fabric(exc) from None
        try:
            return self.plane.create_bucket(name, repo, info.get("default_branch", "main"), created_by_s3=True, **owner)
        except FabricError as exc:
            try:
                self.plane.delete_repo(repo)
            except FabricError:
                pass
            if isinstance(exc, InvalidName):
                raise S3Error("InvalidBucketName", f"The specified bucket is not valid: {exc.message}", 400, BucketName=name) from None
            raise from_fabric(exc) from None

    def _repo_taken(self, repo: str) -> bool:
        try:
            self.plane.get_repo(repo)
            return True
        except NotFound:
            return self.namespace.resolve_bucket(repo) is not None

    def _region_of(self, b: Bucket) -> str:
        return self.locations.get(b.name, b.created) or self.region

    def head_bucket(self, ctx: Ctx, b: Bucket) -> Response:
        require(ctx.who, b.repo, "read")
        return Response(200, {"x-amz-bucket-region": self._region_of(b)})

    def delete_bucket(self, ctx: Ctx, b: Bucket) -> Response:
        require(ctx.who, b.repo, "admin")
        if b.ref is None:
            raise S3Error(
                "AccessDenied",
                f"bucket {b.name!r} is repository {b.repo!r}; delete repositories with `fabric repo delete`",
                403,
            )
        if not b.created_by_s3:
            raise S3Error(
                "AccessDenied",
                f"bucket {b.name!r} was bound with `fabric bucket create`; remove it with `fabric bucket delete {b.name}`",
                403,
            )
        page = self.plane.list(b.repo, b.ref, "", "", "", 1)
        branches = self.plane.list_branches(b.repo)
        tags = self.plane.list_tags(b.repo)
        if page.entries or page.prefixes or len(branches) > 1 or tags:
            raise S3Error("BucketNotEmpty", "The bucket you tried to delete is not empty", 409, BucketName=b.name)
        self.plane.delete_bucket(b.name)
        self.plane.delete_repo(b.repo)
        self.locations.drop(b.name)
        self.namespace.forget(b.name)
        return Response(204)

    # -- configuration reads --------------------------------------------------------------
    def location(self, ctx: Ctx, b: Bucket) -> Response:
        """The LocationConstraint the bucket was created with (empty for us-east-1, S3's way)."""
        require(ctx.who, b.repo, "read")
        region = self._region_of(b)
        text = "" if region == LEGACY_REGION else X.esc(region)
        return xml_response(f'{X.HEADER}<LocationConstraint xmlns="{X.NS}">{text}</LocationConstraint>'.encode())

    # -- ACLs ----------------------------------------------------------------------------
    def get_acl(self, ctx: Ctx, b: Bucket, key: str | None = None) -> Response:
        """The ACL of a bucket or of an existing key in it: always its owner's full control."""
        require(ctx.who, b.repo, "read")
        if key is not None:
            self.namespace.locate_read(ctx.who, b, key)
        resp = xml_response(acl_document(ctx.who.token_id or "anonymous", ctx.who.name))
        resp.headers = {**(resp.headers or {}), NOTE_HEADER: PER_TOKEN}
        return resp

    def put_acl(self, ctx: Ctx, b: Bucket, key: str | None = None) -> Response:
        """Accept the owner-only ACL (it is what every bucket and object has); NotImplemented otherwise."""
        require(ctx.who, b.repo, "write")
        if key is not None:
            self.namespace.locate_read(ctx.who, b, key)
        check_owner_only(ctx.req.headers, ctx.read_small(), ctx.who.token_id or "anonymous")
        return Response(200, {NOTE_HEADER: PER_TOKEN})


def _max_buckets(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_BUCKETS:
        raise S3Error("InvalidArgument", f"max-buckets must be a number from 1 to {MAX_BUCKETS}", 400)
    return n


def _token(last: str) -> str:
    return base64.urlsafe_b64encode(("b:" + last).encode()).decode()


def _token_name(token: str) -> str:
    """The last bucket name of the page before; '' for no token."""
    if not token:
        return ""
    try:
        text = base64.urlsafe_b64decode(token.encode()).decode()
    except (ValueError, binascii.Error, UnicodeDecodeError):
        text = ""
    if not text.startswith("b:"):
        raise S3Error("InvalidArgument", "The continuation token provided is incorrect", 400)
    return text[2:]
