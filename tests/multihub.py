"""Several hub processes on one PostgreSQL catalog and one S3 (moto) pack store: the shared
backing of tests/test_multi_hub.py and tests/test_scale_out.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import boto3

from tests.hubserver import ROOT, hub_env, unique_name
from tests.pgserver import drop_database, fresh_database
from tests.s3_helpers import start_s3_hub


@dataclass
class Backing:
    """A catalog (``db``), a pack store (``store``) and a directory for the hubs' data (``tmp``)."""

    db: str
    store: str
    tmp: str

    def start_hub(self, name: str):
        """A hub process on this catalog and store, its data in ``tmp/name`` (a context manager)."""
        return start_s3_hub(os.path.join(self.tmp, name), db=self.db, args=["--store", self.store])

    def fsck(self) -> dict:
        """``fabric fsck`` of the catalog and store (it must exit 0): its JSON report."""
        r = subprocess.run(
            [sys.executable, "-m", "fabric.cli.main", "--data", os.path.join(self.tmp, "fsck"), "--db", self.db,
             "--store", self.store, "--json", "-q", "fsck"],
            capture_output=True, env=hub_env(), cwd=ROOT, timeout=300,
        )
        assert r.returncode == 0, r.stderr.decode()[-3000:]
        return json.loads(r.stdout)


@contextmanager
def backing(pg_server: str, s3_endpoint: str, tmp_path_factory, prefix: str) -> Iterator[Backing]:
    """A fresh database on ``pg_server`` and a fresh bucket at ``s3_endpoint`` (names from
    ``prefix``); the database is dropped afterwards."""
    db = fresh_database(pg_server, prefix=prefix)
    bucket = "packs-" + unique_name(prefix)
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    store = f"s3://{bucket}/fabric?endpoint_url={s3_endpoint}&region=us-east-1"
    try:
        yield Backing(db, store, str(tmp_path_factory.mktemp(prefix)))
    finally:
        drop_database(db)
