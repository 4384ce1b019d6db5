"""uvicorn settings of an S3 listener (served beside a service's REST API by
:func:`fabric.api.serving.serve_together`)."""

from __future__ import annotations

from typing import Any

import uvicorn


def s3_uvicorn_config(app: Any, host: str, port: int, log_level: str, **kwargs: Any) -> uvicorn.Config:
    """uvicorn settings of an S3 listener: no uvicorn access log, since it prints query strings
    (presigned URLs carry X-Amz-Credential and X-Amz-Signature); the gateway logs method,
    path and status itself on ``fabric.s3.access``."""
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False, timeout_keep_alive=30, **kwargs)
