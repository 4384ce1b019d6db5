"""Names in spoke groups, shared by the hub (which keeps membership) and spokes.

A group's name is 1-64 characters of ``[A-Za-z0-9._-]``. A member is named by
its URL in one canonical form (:func:`member_url`): every member must name every
other the same way, or they compute different owners for a chunk.
"""

from __future__ import annotations

import re

import httpx

from fabric.errors import BadRequest

#: The longest member URL accepted.
MAX_URL = 512
_GROUP = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def check_group_name(name: str) -> str:
    """``name`` if it is a valid group name; BadRequest otherwise."""
    if not isinstance(name, str) or not _GROUP.match(name):
        raise BadRequest(f"a group name is 1 to 64 characters of letters, digits, '.', '_' and '-', not {name!r}")
    return name


def member_url(text: str) -> str:
    """``text`` as the name of a member: an ``http(s)://host[:port][/path]`` URL with a
    lower-case scheme and host and no trailing slash; BadRequest for anything else."""
    if not isinstance(text, str) or not 0 < len(text.strip()) <= MAX_URL:
        raise BadRequest(f"a member URL is 1 to {MAX_URL} characters, like http://spoke-1:8700")
    try:
        url = httpx.URL(text.strip())
    except (httpx.InvalidURL, TypeError) as exc:
        raise BadRequest(f"{text!r} is not a URL: {exc}") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise BadRequest(f"a member URL must be http:// or https:// with a host, like http://spoke-1:8700, not {text!r}")
    if url.query or url.fragment or url.userinfo:
        raise BadRequest(f"a member URL has no query, fragment or user name: {text!r}")
    host = f"[{url.host}]" if ":" in url.host else url.host
    port = f":{url.port}" if url.port is not None else ""
    return f"{url.scheme}://{host.lower()}{port}{url.path.rstrip('/')}"
