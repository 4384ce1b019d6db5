"""REST routes of S3 bucket bindings: bucket names bound to a branch or tag of a repository."""

from fastapi import APIRouter, Response
from pydantic import BaseModel, Field

from fabric.api.routing import Authenticator, PlaneGetter, caller


class BucketCreate(BaseModel):
    name: str = Field(description="bucket name: 3-63 of a-z, 0-9, '-' and '.' (dots between letters or digits)")
    repo: str
    ref: str = Field(description="a branch or tag of the repository")
    created_by_s3: bool = False


class BucketInfo(BaseModel):
    name: str
    repo: str
    ref: str
    created: float
    created_by_s3: bool


def add_bucket_routes(router: APIRouter, plane: PlaneGetter, authenticate: Authenticator) -> None:
    """Add the bucket binding routes to ``router``; ``plane()`` is the data plane to serve."""
    Caller = caller(authenticate)

    @router.get("/buckets", response_model=list[BucketInfo], tags=["buckets"])
    def list_buckets(who: Caller) -> list[dict]:
        return [b for b in plane().list_buckets() if who.can(b["repo"], "read")]

    @router.get("/buckets/{name}", response_model=BucketInfo, tags=["buckets"])
    def get_bucket(name: str, who: Caller) -> dict:
        b = plane().get_bucket(name)
        who.require(b["repo"], "read")
        return b

    @router.post("/buckets", response_model=BucketInfo, status_code=201, tags=["buckets"])
    def create_bucket(body: BucketCreate, who: Caller) -> dict:
        """Bind an S3 bucket name to a branch or tag of a repository (plain keys over S3).

        Needs the ``admin`` role on the repository (its owner has it). ``created_by_s3``
        (S3 DeleteBucket then deletes the repository too) needs no more: that role may
        delete the repository anyway. ``owner`` is who asks (a spoke forwards it)."""
        who.require(body.repo, "admin")
        if who.token_id is None:  # authentication is off
            return plane().create_bucket(body.name, body.repo, body.ref, body.created_by_s3)
        return plane().create_bucket(body.name, body.repo, body.ref, body.created_by_s3, owner=who.token_id)

    @router.delete("/buckets/{name}", status_code=204, tags=["buckets"])
    def delete_bucket(name: str, who: Caller) -> Response:
        """Remove a bucket binding; the repository stays."""
        who.require(plane().get_bucket(name)["repo"], "admin")
        plane().delete_bucket(name)
        return Response(status_code=204)
