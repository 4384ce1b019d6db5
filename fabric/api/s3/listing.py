"""ListObjects (v1 and v2): the keys of a bucket, S3 style, over the plane's listings.

A repository bucket lists its branches and tags as the first level of keys
(``REF/``); each ref then lists as the plane does, with S3's markers, delimiters
and directory markers (a key ending in ``/``) mapped onto it.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from fabric.api.s3 import xml as X
from fabric.api.s3.auth import require
from fabric.api.s3.entrymeta import slash_key
from fabric.api.s3.errors import S3Error, from_fabric
from fabric.api.s3.namespace import Bucket
from fabric.api.s3.request import Ctx, iso8601, owner_xml, xml_response
from fabric.api.s3.specials import shown
from fabric.api.s3.transport import Response
from fabric.errors import FabricError, NotFound
from fabric.format.paths import check_prefix
from fabric.plane.dataplane import DataPlane


def listing_options(q: Mapping[str, str]) -> tuple[bool, int]:
    """``encoding-type=url`` and ``max-keys`` of a listing request (InvalidArgument when bad)."""
    url = q.get("encoding-type") == "url"
    if "encoding-type" in q and not url:
        raise S3Error("InvalidArgument", "Invalid Encoding Method specified in Request", 400)
    try:
        max_keys = int(q.get("max-keys", "1000"))
    except ValueError:
        raise S3Error("InvalidArgument", "Provided max-keys not an integer or within integer range", 400) from None
    if max_keys < 0:
        raise S3Error("InvalidArgument", "max-keys must be zero or more", 400)
    return url, max_keys


class Listing:
    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane

    def list_objects(self, ctx: Ctx, b: Bucket, v2: bool) -> Response:
        require(ctx.who, b.repo, "read")
        q = ctx.q
        prefix = q.get("prefix", "")
        delimiter = q.get("delimiter", "")
        url, max_keys = listing_options(q)
        max_keys = min(max_keys, 1000)
        if v2:
            token = q.get("continuation-token")  # an empty one is no token (and is echoed as given)
            start_after = q.get("start-after", "")
            marker = start_after
            if token:
                try:
                    marker = base64.urlsafe_b64decode(token.encode()).decode()
                    if not marker.startswith("k:"):
                        raise ValueError
                    marker = marker[2:]
                except (ValueError, binascii.Error, UnicodeDecodeError):
                    raise S3Error("InvalidArgument", "The continuation token provided is incorrect", 400) from None
        else:
            marker = q.get("marker", "")
        contents, prefixes, truncated = self._list(b, prefix, delimiter, marker, max_keys)
        last = max(([contents[-1][0]] if contents else []) + ([prefixes[-1]] if prefixes else []), default="")
        fetch_owner = (not v2) or q.get("fetch-owner") == "true"
        owner = owner_xml(ctx) if fetch_owner else ""
        out = [X.el("Name", b.name), f"<Prefix>{X.key_text(prefix, url)}</Prefix>"]
        if v2:
            if "continuation-token" in q:
                out.append(X.el("ContinuationToken", q["continuation-token"]))
            if "start-after" in q:
                out.append(f"<StartAfter>{X.key_text(q['start-after'], url)}</StartAfter>")
            out.append(X.el("KeyCount", len(contents) + len(prefixes)))
        else:
            out.append(f"<Marker>{X.key_text(marker, url)}</Marker>")
        out.append(X.el("MaxKeys", max_keys))
        if delimiter:
            out.append(f"<Delimiter>{X.key_text(delimiter, url)}</Delimiter>")
        if url:
            out.append("<EncodingType>url</EncodingType>")
        out.append(X.el("IsTruncated", "true" if truncated else "false"))
        if truncated and last:
            if v2:
                out.append(X.el("NextContinuationToken", base64.urlsafe_b64encode(("k:" + last).encode()).decode()))
            else:
                out.append(f"<NextMarker>{X.key_text(last, url)}</NextMarker>")
        for key, e in contents:
            etag = X.esc(f'"{e.md5}"')
            out.append(
                f"<Contents><Key>{X.key_text(key, url)}</Key><LastModified>{iso8601(e.mtime_ns / 1e9)}</LastModified>"
                f"<ETag>{etag}</ETag><Size>{e.size}</Size>{owner}<StorageClass>STANDARD</StorageClass></Contents>"
            )
        for p in prefixes:
            out.append(f"<CommonPrefixes><Prefix>{X.key_text(p, url)}</Prefix></CommonPrefixes>")
        return xml_response(X.doc("ListBucketResult", "".join(out)))

    def _list(self, b: Bucket, prefix: str, delimiter: str, marker: str, max_keys: int) -> tuple[list, list, bool]:
        """Keys (with entries) and common prefixes after ``marker``, S3 style; and whether more follow."""
        if max_keys == 0:
            return [], [], False
        if b.ref is not None:
            return self._list_ref(b.repo, b.ref, "", prefix, delimiter, marker, max_keys)
        if "/" in prefix:
            ref, _, sub = prefix.partition("/")
            return self._list_ref(b.repo, ref, ref + "/", sub, delimiter, marker, max_keys)
        refs = sorted(
            {r["name"] for r in self.plane.list_branches(b.repo)} | {t["name"] for t in self.plane.list_tags(b.repo)},
            key=lambda n: n + "/",
        )
        contents: list = []
        prefixes: list = []
        for ref in refs:
            head = ref + "/"
            if not ref.startswith(prefix) or (marker and head <= marker and not marker.startswith(head)):
                continue
            if delimiter == "/" or (delimiter and delimiter in head[len(prefix) :]):
                cut = head[len(prefix) :].find(delimiter)
                p = prefix + head[len(prefix) : len(prefix) + cut + len(delimiter)]
                if marker and p <= marker:
                    continue
                if prefixes and prefixes[-1] == p:
                    continue
                if len(contents) + len(prefixes) >= max_keys:
                    return contents, prefixes, True
                prefixes.append(p)
                continue
            room = max_keys - len(contents) - len(prefixes)
            if room <= 0:
                return contents, prefixes, True
            c, p, more = self._list_ref(b.repo, ref, head, "", delimiter, marker, room)
            contents += c
            prefixes += p
            if more:
                return contents, prefixes, True
        return contents, prefixes, False

    def _list_ref(
        self, repo: str, ref: str, head: str, prefix: str, delimiter: str, marker: str, max_keys: int
    ) -> tuple[list, list, bool]:
        """List one ref; keys are ``head + path``. ``marker`` is a full key."""
        after = ""
        if marker:
            if marker.startswith(head):
                after = marker[len(head) :]
            elif marker > head:
                return [], [], False
        if after and not delimiter and after.endswith("/"):
            after = after[:-1]
        engine_delim = "/" if delimiter == "/" else ""
        contents: list = []
        prefixes: list = []
        seen_prefixes: set[str] = set()
        # A directory marker whose key equals the prefix lists first (S3 lists key == prefix).
        if prefix.endswith("/") and len(prefix) > 1 and (not after or after < prefix):
            try:
                e = self.plane.stat(repo, ref, prefix[:-1])
                if slash_key(e):
                    contents.append((head + prefix, e))
            except FabricError:
                pass
        try:
            check_prefix(prefix)
        except FabricError:
            return [], [], False
        while True:
            room = max_keys - len(contents) - len(prefixes)
            if room <= 0:
                return contents, prefixes, True
            try:
                page = self.plane.list(repo, ref, prefix, engine_delim, after, room if engine_delim or not delimiter else 1000)
            except NotFound:
                if not head:
                    raise
                return contents, prefixes, False
            except FabricError as exc:
                raise from_fabric(exc, "NoSuchKey") from None
            items: list[tuple[str, Any]] = [(p, e) for p, e in page.entries] + [(p, None) for p in page.prefixes]
            items.sort(key=lambda it: it[0])
            for path, e in items:
                if len(contents) + len(prefixes) >= max_keys:
                    return contents, prefixes, True
                if e is None:
                    key = head + path
                    if key not in seen_prefixes:
                        seen_prefixes.add(key)
                        prefixes.append(key)
                    after = path
                    continue
                after = path
                if not shown(e):
                    continue
                key = head + path + ("/" if slash_key(e) else "")
                if delimiter:
                    rest = key[len(head) + len(prefix) :]
                    cut = rest.find(delimiter)
                    if cut >= 0:
                        p = head + prefix + rest[: cut + len(delimiter)]
                        if p not in seen_prefixes and (not marker or p > marker):
                            seen_prefixes.add(p)
                            prefixes.append(p)
                        continue
                contents.append((key, e))
            if page.next_after is None:
                return contents, prefixes, False
            after = page.next_after
