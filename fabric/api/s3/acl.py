"""ACL calls (Get/PutBucketAcl, Get/PutObjectAcl).

fabric grants access per token (a token's roles on repositories), never per bucket
or object, so the only ACL it can keep is the one every bucket and object already
has: the owner's full control. Asking for exactly that (the canned ``private`` ACL,
no ACL at all, or a document or ``x-amz-grant-full-control`` naming only the owner)
succeeds and changes nothing; any other ACL is NotImplemented, saying why.
"""

from __future__ import annotations

import re

from fabric.api.s3 import xml as X
from fabric.api.s3.errors import S3Error

#: Said in ACL answers (a response header) and in the NotImplemented of other ACLs.
PER_TOKEN = "fabric grants access per token (roles on repositories), not with ACLs"
NOTE_HEADER = "x-fabric-acl"
_GRANT_HEADERS = ("x-amz-grant-read", "x-amz-grant-write", "x-amz-grant-read-acp", "x-amz-grant-write-acp")
_GRANTEE = re.compile(r'\s*(\w+)\s*=\s*"?([^",]*)"?\s*')
_XSI = "{http://www.w3.org/2001/XMLSchema-instance}type"


def acl_document(owner_id: str, owner_name: str) -> bytes:
    """The ACL of every bucket and object: its owner has full control."""
    grant = (
        '<Grant><Grantee xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" xsi:type="CanonicalUser">'
        f"{X.el('ID', owner_id)}{X.el('DisplayName', owner_name)}</Grantee>"
        "<Permission>FULL_CONTROL</Permission></Grant>"
    )
    return X.doc("AccessControlPolicy", f"{X.owner(owner_name, owner_id)}<AccessControlList>{grant}</AccessControlList>")


def _not_implemented(what: str) -> S3Error:
    return S3Error(
        "NotImplemented",
        f"{what}: {PER_TOKEN}; only the owner's full control (the canned 'private' ACL) can be set",
        501,
    )


def check_owner_only(headers: dict[str, str], body: bytes, owner_id: str) -> None:
    """Accept an ACL request that asks for the owner's full control alone; NotImplemented otherwise."""
    canned = headers.get("x-amz-acl")
    grants = {h: headers[h] for h in (*_GRANT_HEADERS, "x-amz-grant-full-control") if h in headers}
    given = [bool(canned is not None), bool(grants), bool(body.strip())]
    if sum(given) > 1:
        raise S3Error("InvalidRequest", "Specify an ACL with one of x-amz-acl, x-amz-grant-* or a document", 400)
    if canned is not None and canned.strip() != "private":
        raise _not_implemented(f"the canned ACL {canned.strip()[:40]!r}")
    if grants:
        if set(grants) != {"x-amz-grant-full-control"} or _grantees(grants["x-amz-grant-full-control"]) != [("id", owner_id)]:
            raise _not_implemented("grants to anyone but the owner")
    if body.strip():
        _check_document(body, owner_id)


def _grantees(value: str) -> list[tuple[str, str]]:
    out = []
    for part in value.split(","):
        m = _GRANTEE.fullmatch(part)
        if not m:
            raise S3Error("InvalidArgument", "malformed x-amz-grant-full-control header", 400)
        out.append((m.group(1).lower(), m.group(2)))
    return out


def _check_document(body: bytes, owner_id: str) -> None:
    tree = X.parse(body, "AccessControlPolicy")
    acl = X.children(tree, "AccessControlList")
    grants = X.children(acl[0], "Grant") if acl else []
    if not grants:
        raise _not_implemented("an ACL without the owner's full control")
    for grant in grants:
        grantee = X.children(grant, "Grantee")
        kind = grantee[0].get(_XSI, "") if grantee else ""
        who = X.child_text(grantee[0], "ID") if grantee else None
        if kind != "CanonicalUser" or (who or "").strip() != owner_id or (X.child_text(grant, "Permission") or "").strip() != "FULL_CONTROL":
            raise _not_implemented("grants to anyone but the owner")
