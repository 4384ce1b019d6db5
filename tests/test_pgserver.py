"""The throwaway PostgreSQL server used by the catalog tests works."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

import pytest

from tests.ci_requirements import requires
from tests.pgserver import drop_database, fresh_database, postgres_unavailable_reason, start_postgres

psycopg = pytest.importorskip("psycopg")

pytestmark = [
    pytest.mark.postgres,
    requires(postgres_unavailable_reason),
]


@pytest.fixture(scope="module")
def pg_server():
    with start_postgres() as url:
        yield url


def test_server_url_shape(pg_server):
    if os.environ.get("FABRIC_TEST_POSTGRES_URL"):
        pytest.skip("external server")
    u = urlsplit(pg_server)
    assert u.scheme == "postgresql"
    assert u.hostname == "127.0.0.1"
    assert u.port and u.port > 0
    assert u.path.strip("/")


def test_fresh_database_roundtrip(pg_server):
    url = fresh_database(pg_server)
    other = fresh_database(pg_server)
    assert url != other
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("SELECT current_database()").fetchone()[0] == \
                urlsplit(url).path.lstrip("/")
            conn.execute("CREATE TABLE kv (k text PRIMARY KEY, v bytea NOT NULL)")
            conn.execute("INSERT INTO kv VALUES (%s, %s)", ("hello", b"\x00world"))
            assert conn.execute("SELECT v FROM kv WHERE k = %s", ("hello",)).fetchone()[0] \
                == b"\x00world"
        # The other fresh database is really separate and empty.
        with psycopg.connect(other) as conn:
            n = conn.execute(
                "SELECT count(*) FROM information_schema.tables WHERE table_name = 'kv'"
            ).fetchone()[0]
            assert n == 0
    finally:
        drop_database(url)
        drop_database(other)
    with psycopg.connect(pg_server) as conn:
        names = {r[0] for r in conn.execute("SELECT datname FROM pg_database")}
    assert urlsplit(url).path.lstrip("/") not in names


def test_server_stops_and_cleans_up():
    if os.environ.get("FABRIC_TEST_POSTGRES_URL"):
        pytest.skip("external server")
    with start_postgres() as url:
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT 1").fetchone()[0] == 1
            datadir = conn.execute("SHOW data_directory").fetchone()[0]
    assert not os.path.exists(os.path.dirname(datadir))
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=2)
