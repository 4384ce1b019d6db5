"""S3 bucket operations: ListBuckets, Create/Head/DeleteBucket and the bucket
configuration reads (location, versioning, ACL) that clients ask for."""

from __future__ import annotations

from fabric.api.s3 import xml as X
from fabric.api.s3.auth import require
from fabric.api.s3.errors import S3Error, from_fabric
from fabric.api.s3.namespace import Bucket, Namespace
from fabric.api.s3.request import Ctx, acl_xml, iso8601, owner_xml, xml_response
from fabric.api.s3.transport import Response
from fabric.errors import FabricError
from fabric.format.paths import check_repo_name
from fabric.plane.dataplane import DataPlane


class BucketHandlers:
    def __init__(self, plane: DataPlane, namespace: Namespace, region: str) -> None:
        self.plane = plane
        self.namespace = namespace
        self.region = region

    def list_buckets(self, ctx: Ctx) -> Response:
        who = ctx.who
        found: dict[str, float] = {}
        repos = {r["name"]: r for r in self.plane.list_repos()}
        for r in repos.values():
            if who.can(r["name"], "read"):
                found[r["name"]] = r.get("created", 0.0)
        for bd in self.plane.list_buckets():
            if bd["repo"] in repos and who.can(bd["repo"], "read"):
                found[bd["name"]] = bd.get("created", 0.0)
        items = [(n, iso8601(c)) for n, c in sorted(found.items())]
        return xml_response(X.list_buckets(items, owner_xml(ctx)))

    def create_bucket(self, ctx: Ctx, name: str) -> Response:
        try:
            check_repo_name(name)
        except FabricError:
            raise S3Error("InvalidBucketName", "The specified bucket is not valid.", 400, BucketName=name) from None
        X.parse_location(ctx.read_small(1 << 20))
        existing = self.namespace.resolve_bucket(name)
        if existing is not None:
            if ctx.who.can(existing.repo, "admin"):
                raise S3Error("BucketAlreadyOwnedByYou", "Your previous request to create the named bucket succeeded and you already own it.", 409, BucketName=name)
            raise S3Error("BucketAlreadyExists", "The requested bucket name is not available.", 409, BucketName=name)
        if not ctx.who.admin:
            raise S3Error("AccessDenied", f"token {ctx.who.name!r} may not create repositories (an admin token may)", 403)
        try:
            info = self.plane.create_repo(name)
        except FabricError as exc:
            if exc.status == 409:
                raise S3Error("BucketAlreadyExists", "The requested bucket name is not available.", 409, BucketName=name) from None
            raise from_fabric(exc) from None
        try:
            self.plane.create_bucket(name, name, info.get("default_branch", "main"), created_by_s3=True)
        except FabricError as exc:
            try:
                self.plane.delete_repo(name)
            except FabricError:
                pass
            raise from_fabric(exc) from None
        self.namespace.forget(name)
        return Response(200, {"Location": f"/{name}"})

    def head_bucket(self, ctx: Ctx, b: Bucket) -> Response:
        require(ctx.who, b.repo, "read")
        return Response(200, {"x-amz-bucket-region": self.region})

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
        self.namespace.forget(b.name)
        return Response(204)

    # -- configuration reads --------------------------------------------------------------
    def location(self, ctx: Ctx, b: Bucket) -> Response:
        require(ctx.who, b.repo, "read")
        region = "" if self.region == "us-east-1" else X.esc(self.region)
        return xml_response(f'{X.HEADER}<LocationConstraint xmlns="{X.NS}">{region}</LocationConstraint>'.encode())

    def versioning(self, ctx: Ctx, b: Bucket) -> Response:
        require(ctx.who, b.repo, "read")
        return xml_response(X.doc("VersioningConfiguration", ""))

    def acl(self, ctx: Ctx, b: Bucket) -> Response:
        """The ACL of a bucket or of an object in it: always the caller's full control."""
        require(ctx.who, b.repo, "read")
        return xml_response(acl_xml(ctx))
