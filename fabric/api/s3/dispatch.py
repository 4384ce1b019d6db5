"""Routing one S3 request to its operation, by method, bucket, key and sub-resource."""

from __future__ import annotations

from fabric.api.s3 import sigv4
from fabric.api.s3.auth import Authenticator
from fabric.api.s3.buckets import BucketHandlers
from fabric.api.s3.cors import preflight_refusal
from fabric.api.s3.errors import S3Error
from fabric.api.s3.listing import Listing
from fabric.api.s3.multipart_handlers import MultipartHandlers
from fabric.api.s3.namespace import Namespace, check_key_encoding
from fabric.api.s3.objects import ObjectHandlers
from fabric.api.s3.request import Ctx
from fabric.api.s3.transport import AsgiBody, GatewayStats, Response
from fabric.api.s3.versions import VersionHandlers

#: Sub-resources we answer NotImplemented (rather than mistaking them for a plain GET/PUT).
UNSUPPORTED = {
    "policy", "cors", "lifecycle", "website", "logging", "notification", "replication", "encryption",
    "object-lock", "retention", "legal-hold", "accelerate", "requestPayment", "ownershipControls",
    "publicAccessBlock", "intelligent-tiering", "inventory", "metrics", "analytics", "restore", "select",
    "torrent", "attributes", "policyStatus", "rename",
}


def _method_not_allowed() -> S3Error:
    return S3Error("MethodNotAllowed", "The specified method is not allowed against this resource.", 405)


class Dispatcher:
    """Authenticates a request, then calls the operation it names; ``op[0]`` gets the operation's name."""

    def __init__(
        self,
        auth: Authenticator,
        namespace: Namespace,
        stats: GatewayStats,
        buckets: BucketHandlers,
        listing: Listing,
        objects: ObjectHandlers,
        multipart: MultipartHandlers,
    ) -> None:
        self.auth = auth
        self.namespace = namespace
        self.stats = stats
        self.buckets = buckets
        self.listing = listing
        self.objects = objects
        self.multipart = multipart
        self.versions = VersionHandlers(namespace.plane, namespace)

    def handle(self, req: sigv4.SignedRequest, rid: str, body: AsgiBody, op: list[str]) -> Response:
        if req.method == "OPTIONS":
            op[0] = "PreflightRequest"
            raise preflight_refusal(req)
        check_key_encoding(req.raw_path)
        auth = self.auth.authenticate(req)
        q = {k: v for k, v in req.query}
        ctx = Ctx(req, rid, auth.principal, auth, body, q, self.stats)
        parts = req.path.lstrip("/").split("/", 1) if req.path != "/" else [""]
        bucket_name = parts[0]
        key = parts[1] if len(parts) > 1 else ""
        m = req.method
        for sub in q:
            if sub in UNSUPPORTED:
                raise S3Error("NotImplemented", f"the {sub!r} sub-resource is not supported by this S3 gateway", 501)
        if not bucket_name:
            op[0] = "ListBuckets"
            if m in ("GET", "HEAD"):
                return _finish(ctx, self.buckets.list_buckets(ctx))
            raise _method_not_allowed()
        if not key:
            return _finish(ctx, self._bucket_op(ctx, m, bucket_name, op))
        return _finish(ctx, self._object_op(ctx, m, bucket_name, key, op))

    def _bucket_op(self, ctx: Ctx, m: str, name: str, op: list[str]) -> Response:
        q = ctx.q
        if m == "PUT":
            if "versioning" in q:
                op[0] = "PutBucketVersioning"
                return self.versions.put_versioning(ctx, self.namespace.bucket(name))
            if "tagging" in q:
                raise S3Error("NotImplemented", "bucket configuration cannot be changed on this gateway", 501)
            if "acl" in q:
                op[0] = "PutBucketAcl"
                return self.buckets.put_acl(ctx, self.namespace.bucket(name))
            op[0] = "CreateBucket"
            return self.buckets.create_bucket(ctx, name)
        b = self.namespace.bucket(name, fresh=m == "POST" and "delete" in q)
        if m == "HEAD":
            op[0] = "HeadBucket"
            return self.buckets.head_bucket(ctx, b)
        if m == "DELETE":
            op[0] = "DeleteBucket"
            return self.buckets.delete_bucket(ctx, b)
        if m == "POST":
            if "delete" in q:
                op[0] = "DeleteObjects"
                return self.objects.delete_objects(ctx, b)
            raise _method_not_allowed()
        if m != "GET":
            raise _method_not_allowed()
        if "location" in q:
            op[0] = "GetBucketLocation"
            return self.buckets.location(ctx, b)
        if "versioning" in q:
            op[0] = "GetBucketVersioning"
            return self.versions.get_versioning(ctx, b)
        if "versions" in q:
            op[0] = "ListObjectVersions"
            return self.versions.list_versions(ctx, b)
        if "acl" in q:
            op[0] = "GetBucketAcl"
            return self.buckets.get_acl(ctx, b)
        if "tagging" in q:
            raise S3Error("NoSuchTagSet", "The TagSet does not exist", 404)
        if "uploads" in q:
            op[0] = "ListMultipartUploads"
            return self.multipart.list_uploads(ctx, b)
        if q.get("list-type") == "2":
            op[0] = "ListObjectsV2"
            return self.listing.list_objects(ctx, b, v2=True)
        op[0] = "ListObjects"
        return self.listing.list_objects(ctx, b, v2=False)

    def _object_op(self, ctx: Ctx, m: str, bucket_name: str, key: str, op: list[str]) -> Response:
        q = ctx.q
        b = self.namespace.bucket(bucket_name, fresh=m == "DELETE" and "uploadId" not in q)
        if m in ("GET", "HEAD"):
            if "uploadId" in q and m == "GET":
                op[0] = "ListParts"
                return self.multipart.list_parts(ctx, b, key)
            if "tagging" in q:
                op[0] = "GetObjectTagging"
                return self.objects.get_tagging(ctx, b, key)
            if "acl" in q:
                op[0] = "GetObjectAcl"
                return self.buckets.get_acl(ctx, b, key)
            op[0] = "HeadObject" if m == "HEAD" else "GetObject"
            return self.objects.get_object(ctx, b, key, m == "HEAD")
        if m == "PUT":
            if "acl" in q:
                op[0] = "PutObjectAcl"
                return self.buckets.put_acl(ctx, b, key)
            if "tagging" in q:
                raise S3Error("NotImplemented", "object tags are not supported by this gateway", 501)
            if "uploadId" in q or "partNumber" in q:
                if ctx.header("x-amz-copy-source"):
                    op[0] = "UploadPartCopy"
                    return self.multipart.upload_part(ctx, b, key, copy=True)
                op[0] = "UploadPart"
                return self.multipart.upload_part(ctx, b, key, copy=False)
            if ctx.header("x-amz-copy-source"):
                op[0] = "CopyObject"
                return self.objects.copy_object(ctx, b, key)
            op[0] = "PutObject"
            return self.objects.put_object(ctx, b, key)
        if m == "DELETE":
            if "uploadId" in q:
                op[0] = "AbortMultipartUpload"
                return self.multipart.abort_upload(ctx, b, key)
            op[0] = "DeleteObject"
            return self.objects.delete_object(ctx, b, key)
        if m == "POST":
            if "uploads" in q:
                op[0] = "CreateMultipartUpload"
                return self.multipart.create_upload(ctx, b, key)
            if "uploadId" in q:
                op[0] = "CompleteMultipartUpload"
                return self.multipart.complete_upload(ctx, b, key)
        raise _method_not_allowed()


def _finish(ctx: Ctx, resp: Response) -> Response:
    h = resp.headers if resp.headers is not None else {}
    h["x-amz-request-id"] = ctx.rid
    h["x-amz-id-2"] = ctx.rid
    resp.headers = h
    return resp
