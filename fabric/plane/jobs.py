"""Jobs: the name a client gives the reads of one training job, and loader hints.

A request may carry ``X-Fabric-Job: <id>`` (:data:`JOB_HEADER`); a spoke accounts its
reads to that job and runs the job's hinted lookahead (``DataPlane.hint``). The id is
1-128 characters of ``[A-Za-z0-9._:@-]``: anything else is refused (400), so a job
name can go into a metric label or a log line as it is.
"""

from __future__ import annotations

import re

from fabric.errors import BadRequest

#: The request header naming the job a request reads for.
JOB_HEADER = "X-Fabric-Job"
#: The environment variable an :class:`~fabric.client.http.HttpPlane` takes its job from.
JOB_ENV = "FABRIC_JOB"
#: Paths in one hint (a longer order is sent in several calls with ``append``).
MAX_HINT_PATHS = 100_000
#: The largest JSON body of one hint (refused, 413, before it is parsed): the bound of every
#: JSON route (``fabric.api.routing.MAX_JSON_BYTES``; this layer cannot import it).
MAX_HINT_BYTES = 4 * 1024 * 1024

_JOB_RE = re.compile(r"[A-Za-z0-9._:@-]{1,128}")


def check_job(job: object) -> str:
    """``job`` if it is a valid job id; BadRequest naming the rule otherwise."""
    if not isinstance(job, str) or not _JOB_RE.fullmatch(job):
        shown = repr(job)[:140]
        raise BadRequest(f"invalid job id {shown}: use 1 to 128 characters of letters, digits and . _ : @ -")
    return job


def check_hint_size(paths: int) -> None:
    """BadRequest when a hint names more than :data:`MAX_HINT_PATHS` paths."""
    if paths > MAX_HINT_PATHS:
        raise BadRequest(
            f"a hint names at most {MAX_HINT_PATHS} paths, not {paths}: send the rest in further calls with append=true"
        )
