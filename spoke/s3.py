"""The spoke's S3 listener: the same gateway as the hub's, over the SpokePlane.

A spoke never holds an S3 secret. It verifies SigV4 signatures (header and
presigned) with the signing key the hub derives for one access key, day, region
and service (:class:`SpokeKeys`): its own token needs the ``spoke`` right (a
global admin token also works), and the principal that comes back has its roles
capped at that token's. A key is remembered per day and region, and kept in use
while the hub is away. SigV2 signatures are keyed by the secret itself, so the
spoke has the hub check each one: V2 requests (old tools, boto3's default
presigned URLs) work while the hub is reachable, and are refused with an S3
error while it is not. Bucket bindings (and that a name is not bound) and
repository answers come from the SpokePlane, which remembers them too, so reads
of cached data do not contact the hub; writes keep their chunks at the spoke's
durability (:meth:`SpokePlane.chunk_sink`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence

from fabric.api.s3 import S3Gateway
from fabric.api.s3.errors import S3Error
from fabric.auth.principal import Principal
from fabric.auth.tokens import ACCESS_KEY_PREFIX
from fabric.errors import Unavailable
from fabric.plane.dataplane import DataPlane

from .plane import SpokePlane
from .remember import Remembered

#: How long an S3 signing key's principal is reused without asking the hub.
KEY_TTL = 30.0


class SpokeKeys:
    """S3 credentials at a spoke (see :class:`fabric.api.s3.auth.Credentials`), from its hub."""

    def __init__(self, plane: SpokePlane) -> None:
        self.hub = plane.upstream
        self._keys = Remembered(KEY_TTL)
        self._asked: dict[str, set[tuple[str, str, str, str]]] = {}
        self._lock = threading.Lock()

    def signing_key(self, access_key: str, date: str, region: str, service: str) -> tuple[Principal, bytes]:
        key = (access_key, date, region, service)
        with self._lock:
            self._asked.setdefault(access_key, set()).add(key)
        try:
            return self._keys.get(key, lambda: self.hub.s3_signing_key(access_key, date, region, service))
        except Unavailable:
            raise S3Error(
                "ServiceUnavailable", "this spoke cannot reach its hub to check an access key it has not seen", 503
            ) from None

    def verify_v2(self, access_key: str, strings_to_sign: Sequence[str], signature: str) -> Principal:
        try:
            principal = self.hub.s3_v2_check(access_key, strings_to_sign, signature)
        except Unavailable:
            raise S3Error(
                "ServiceUnavailable",
                "Signature Version 2 requests are checked by the hub, which this spoke cannot reach now: "
                "sign with Signature Version 4 (e.g. boto3 Config(signature_version='s3v4'))",
                503,
            ) from None
        if principal is None:
            raise S3Error(
                "SignatureDoesNotMatch",
                "The request signature we calculated does not match the signature you provided. "
                "Check your key and signing method.",
                403,
            )
        return principal

    def forget(self, token_id: str) -> None:
        """Ask the hub again about ``token_id``'s key (its roles just changed)."""
        with self._lock:
            asked = self._asked.pop(ACCESS_KEY_PREFIX + token_id.upper(), set())
        for key in asked:
            self._keys.forget(key)


def create_s3_app(plane: DataPlane, cache_dir: str, keys: SpokeKeys | None, access_log: bool = True) -> S3Gateway:
    """The spoke's S3 gateway over ``plane``; ``keys=None`` turns authentication off."""
    return S3Gateway(plane, keys, state_dir=os.path.join(cache_dir, "s3"), access_log_enabled=access_log)
