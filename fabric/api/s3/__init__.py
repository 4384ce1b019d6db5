"""The S3 API: SigV4 authentication, XML documents, and a gateway over any data plane."""

from fabric.api.s3.cache import TTLCache
from fabric.api.s3.gateway import S3Gateway
from fabric.api.s3.namespace import plane_bindings

__all__ = ["S3Gateway", "TTLCache", "plane_bindings"]
