"""The hub's S3 listener: the S3 gateway over the engine, with tokens as S3 key pairs."""

from __future__ import annotations

from fabric.api.s3 import S3Gateway
from fabric.api.s3.auth import SecretCredentials
from fabric.auth.tokens import TokenStore
from fabric.catalog.locations import LocationStore
from fabric.catalog.uploads import UploadStore
from fabric.engine.engine import Engine

from .owners import OwningPlane


def create_s3_app(
    engine: Engine, tokens: TokenStore, auth: bool = True, autocommit: float | None = None, access_log: bool = True
) -> S3Gateway:
    """The hub's S3 gateway; multipart uploads and bucket locations are kept in the catalog
    (any hub process on it serves them). Buckets created over S3 belong to the
    token that created them."""
    return S3Gateway(
        OwningPlane(engine, tokens),
        SecretCredentials(tokens.s3_principal) if auth else None,
        autocommit=autocommit,
        access_log_enabled=access_log,
        uploads=UploadStore(engine.catalog.db),
        locations=LocationStore(engine.catalog.db),
    )
