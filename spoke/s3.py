"""The spoke's S3 listener: the same gateway as the hub's, over the SpokePlane.

S3 signatures are verified at the spoke with the key pair's secret, which the
spoke asks the hub for (its own token must be a global admin token for that)
and remembers, also while the hub is away. Bucket bindings and repository
answers come from the SpokePlane, which remembers them too, so reads of
cached data do not contact the hub.
"""

from __future__ import annotations

import os

from fabric.api.s3 import S3Gateway
from fabric.auth.principal import Principal

from .plane import SpokePlane
from .remember import Remembered

#: How long an S3 key pair's verdict is reused without asking the hub.
KEY_TTL = 30.0


def create_s3_app(plane: SpokePlane, cache_dir: str, auth: bool = True, access_log: bool = True) -> S3Gateway:
    keys = Remembered(KEY_TTL)

    def credentials(access_key_id: str) -> tuple[Principal, str]:
        return keys.get(access_key_id, lambda: plane.upstream.s3_key(access_key_id))

    return S3Gateway(
        plane,
        credentials if auth else None,
        state_dir=os.path.join(cache_dir, "s3"),
        access_log_enabled=access_log,
    )
