"""A hub and a spoke with a few repositories for the console tests (tests/test_console*.py).

``console_env(DIR)`` (a context manager; each test module makes it a module-scoped fixture) starts a hub and a spoke of it that sample their counters
every 0.2 s, and fills two repositories: ``repo`` (text, CSV, parquet, PNG, a directory of
:data:`BIG_DIR_FILES` files, a hostile file name and a hostile commit message, two
commits) and ``secret`` (which the ``reader`` and ``writer`` tokens cannot read).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import struct
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from fabric.client.transfer import import_directory
from tests.hubserver import Hub, start_hub, unique_name
from tests.spokeserver import Spoke, start_spoke

SAMPLE_ENV = {"FABRIC_CONSOLE_SAMPLE_SECONDS": "0.2"}
BIG_DIR_FILES = 450
HOSTILE_NAME = "<img src=x onerror=alert(1)>"
HOSTILE_MESSAGE = "<script>alert('commit')</script> tune the <b>loader</b>"


def png(width: int = 48, height: int = 32) -> bytes:
    """A small valid PNG: a colour gradient."""
    rows = b"".join(b"\0" + bytes(v for x in range(width) for v in (x * 5 % 256, y * 8 % 256, 160)) for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def parquet_bytes() -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"id": list(range(100)), "label": [f"cat-{i % 7}" for i in range(100)], "score": [i / 10 for i in range(100)]})
    out = io.BytesIO()
    pq.write_table(table, out)
    return out.getvalue()


def write_tree(root: str, files: dict[str, bytes]) -> None:
    for path, data in files.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(data)


@dataclass
class ConsoleEnv:
    hub: Hub
    spoke: Spoke
    repo: str
    secret: str
    reader: str  # read on repo only
    writer: str  # write on repo only
    first: str  # commit ids
    second: str

    def session(self, base: str, token: str) -> httpx.Client:
        """An httpx client signed in to the console at ``base`` with ``token``."""
        c = httpx.Client(base_url=base, follow_redirects=False, timeout=60)
        form = c.get("/ui/signin")
        pre = re.search(r'name="csrf" value="([^"]+)"', form.text).group(1)
        r = c.post("/ui/signin", data={"token": token, "csrf": pre, "next": "/ui/repos"})
        assert r.status_code == 303, r.text
        return c


@contextlib.contextmanager
def console_env(tmp: Path) -> Iterator[ConsoleEnv]:
    """The hub, spoke and repositories described above, under directory ``tmp``."""
    with start_hub(tmp / "hub", env=SAMPLE_ENV) as hub:
        admin = hub.plane()
        repo, secret = unique_name("datasets"), unique_name("secret")
        admin.create_repo(repo)
        admin.create_repo(secret)
        files = {
            "README.md": b"# Datasets\n\nTraining data for the <em>demo</em> model.\n",
            "data/train.csv": b"id,label,score\n" + b"".join(f"{i},cat-{i % 5},{i / 3:.3f}\n".encode() for i in range(60)),
            "data/table.parquet": parquet_bytes(),
            "images/sample.png": png(),
            "page.html": b"<html><script>alert('page')</script></html>",
            f"evil/{HOSTILE_NAME}": b"<script>alert('content')</script>\n",
            **{f"big/shard-{i:05d}.bin": os.urandom(64) for i in range(BIG_DIR_FILES)},
        }
        write_tree(str(tmp / "v1"), files)
        first = import_directory(admin, str(tmp / "v1"), repo, "main", "first import").commit
        changed = {
            "data/train.csv": files["data/train.csv"] + b"".join(f"{i},cat-{i % 5},{i / 3:.3f}\n".encode() for i in range(60, 200)),
            "notes/extra.txt": b"more\n" * 1000,
        }
        write_tree(str(tmp / "v1"), changed)  # only these: the other files keep their mtimes, so stay unchanged
        os.remove(str(tmp / "v1" / "big" / "shard-00001.bin"))
        second = import_directory(admin, str(tmp / "v1"), repo, "main", HOSTILE_MESSAGE).commit
        write_tree(str(tmp / "s1"), {"private/plan.txt": b"secret plans\n"})
        import_directory(admin, str(tmp / "s1"), secret, "main", "secret import")
        reader = admin.create_token(unique_name("reader"), roles={repo: "read"})["token"]
        writer = admin.create_token(unique_name("writer"), roles={repo: "write"})["token"]
        with start_spoke(hub.url, tmp / "spoke-cache", "256MiB", token=hub.token, env=SAMPLE_ENV) as spoke:
            deadline = time.time() + 30
            while spoke.plane(hub.token).resolve_commit(repo, "main") != second.id and time.time() < deadline:
                time.sleep(0.1)
            yield ConsoleEnv(hub, spoke, repo, secret, reader, writer, first.id, second.id)
