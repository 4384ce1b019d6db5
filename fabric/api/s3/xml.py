"""S3 XML documents: responses written as text, requests parsed with ElementTree.

Requests are parsed defensively: a size limit, no DTDs or entities, and a
``MalformedXML`` error for anything that is not the expected document.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from urllib.parse import quote

from fabric.api.s3.errors import S3Error

NS = "http://s3.amazonaws.com/doc/2006-03-01/"
HEADER = '<?xml version="1.0" encoding="UTF-8"?>\n'
MAX_XML_BYTES = 4 * 1024 * 1024
_BAD_CHARS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def esc(text: object) -> str:
    s = str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    if _BAD_CHARS.search(s):
        s = _BAD_CHARS.sub(lambda m: f"&#x{ord(m.group()):x};", s)
    return s


def key_text(key: str, url: bool) -> str:
    """A key as written into a listing: URL-encoded with ``encoding-type=url``."""
    return quote(key, safe="/~-_.") if url else esc(key)


def doc(root: str, body: str) -> bytes:
    return f'{HEADER}<{root} xmlns="{NS}">{body}</{root}>'.encode()


def el(name: str, value: object) -> str:
    return f"<{name}>{esc(value)}</{name}>"


def error_doc(code: str, message: str, resource: str, request_id: str, extra: dict[str, str] | None = None) -> bytes:
    parts = [el("Code", code), el("Message", message)]
    for k, v in (extra or {}).items():
        parts.append(el(k, v))
    parts += [el("Resource", resource), el("RequestId", request_id), el("HostId", request_id)]
    return f"{HEADER}<Error>{''.join(parts)}</Error>".encode()


def owner(principal_name: str, principal_id: str) -> str:
    return f"<Owner>{el('ID', principal_id)}{el('DisplayName', principal_name)}</Owner>"


def list_buckets(
    buckets: Iterable[tuple[str, str]], owner_xml: str, next_token: str | None = None, prefix: str | None = None
) -> bytes:
    """``ListAllMyBucketsResult``; ``next_token`` (S3 calls it ContinuationToken) when there are more."""
    items = "".join(f"<Bucket>{el('Name', n)}{el('CreationDate', d)}</Bucket>" for n, d in buckets)
    more = el("ContinuationToken", next_token) if next_token else ""
    pre = el("Prefix", prefix) if prefix is not None else ""
    return doc("ListAllMyBucketsResult", f"{owner_xml}<Buckets>{items}</Buckets>{more}{pre}")


# -- parsing ---------------------------------------------------------------------------
def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def parse(body: bytes, root: str) -> ET.Element:
    """Parse a request document whose root element is ``root`` (namespace optional)."""
    if len(body) > MAX_XML_BYTES:
        raise S3Error("MalformedXML", f"the XML document is over {MAX_XML_BYTES} bytes", 400)
    if b"<!DOCTYPE" in body or b"<!ENTITY" in body:
        raise S3Error("MalformedXML", "XML documents with a DTD or entities are not accepted", 400)
    try:
        tree = ET.fromstring(body)
    except ET.ParseError:
        raise S3Error(
            "MalformedXML", "The XML you provided was not well-formed or did not validate against our published schema", 400
        ) from None
    if _local(tree.tag) != root:
        raise S3Error("MalformedXML", f"expected a {root} document, got {_local(tree.tag)}", 400)
    return tree


def children(node: ET.Element, name: str) -> list[ET.Element]:
    return [c for c in node if _local(c.tag) == name]


def child_text(node: ET.Element, name: str) -> str | None:
    for c in node:
        if _local(c.tag) == name:
            return c.text or ""
    return None


def parse_delete_objects(body: bytes) -> tuple[list[tuple[str, str | None]], bool]:
    """A ``Delete`` document -> ([(key, version id or None)], quiet)."""
    tree = parse(body, "Delete")
    objects = []
    for obj in children(tree, "Object"):
        key = child_text(obj, "Key")
        if key is None:
            raise S3Error("MalformedXML", "an Object in the Delete document lacks its Key", 400)
        objects.append((key, child_text(obj, "VersionId")))
    if not objects:
        raise S3Error("MalformedXML", "the Delete document names no Object", 400)
    if len(objects) > 1000:
        raise S3Error("MalformedXML", "a Delete document names at most 1000 objects", 400)
    quiet = (child_text(tree, "Quiet") or "").strip().lower() == "true"
    return objects, quiet


def parse_versioning(body: bytes) -> tuple[str | None, str | None]:
    """A ``VersioningConfiguration`` document -> (Status, MfaDelete), each None when absent;
    MalformedXML for values S3 does not know."""
    tree = parse(body, "VersioningConfiguration")
    status, mfa = child_text(tree, "Status"), child_text(tree, "MfaDelete")
    if status not in (None, "Enabled", "Suspended") or mfa not in (None, "Enabled", "Disabled"):
        raise S3Error(
            "MalformedXML", "The XML you provided was not well-formed or did not validate against our published schema", 400
        )
    return status, mfa


def parse_complete(body: bytes) -> list[tuple[int, str]]:
    """A ``CompleteMultipartUpload`` document -> [(part number, etag without quotes)]."""
    tree = parse(body, "CompleteMultipartUpload")
    parts = []
    for p in children(tree, "Part"):
        num, etag = child_text(p, "PartNumber"), child_text(p, "ETag")
        if num is None or etag is None:
            raise S3Error("MalformedXML", "each Part needs a PartNumber and an ETag", 400)
        try:
            n = int(num.strip())
        except ValueError:
            raise S3Error("MalformedXML", f"PartNumber {num[:20]!r} is not a number", 400) from None
        parts.append((n, etag.strip().strip('"')))
    if not parts:
        raise S3Error("MalformedXML", "The XML you provided did not list any part", 400)
    return parts


def parse_location(body: bytes) -> str | None:
    """An optional ``CreateBucketConfiguration`` -> its LocationConstraint."""
    if not body.strip():
        return None
    tree = parse(body, "CreateBucketConfiguration")
    return child_text(tree, "LocationConstraint")
