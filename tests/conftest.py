"""Shared fixtures: engines on SQLite and PostgreSQL, a moto S3 endpoint, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from fabric.engine.engine import Engine
from tests.ci_requirements import missing, pytest_configure, pytest_runtest_setup  # noqa: F401 - the `requires` mark's hooks
from tests.hubserver import Hub, start_hub
from tests.moto_server import start_moto
from tests.pgserver import drop_database, fresh_database, postgres_available, postgres_unavailable_reason, start_postgres
from tests.s3_fixtures import admin, repo, s3, s3hub  # noqa: F401 - shared by the S3 test modules

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    if not postgres_available():
        missing(postgres_unavailable_reason())
    with start_postgres() as url:
        yield url


@pytest.fixture
def pg_url(pg_server: str) -> Iterator[str]:
    url = fresh_database(pg_server)
    yield url
    drop_database(url)


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    with start_moto() as endpoint:
        yield endpoint


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """A catalog URL: every test using it runs once on SQLite and once on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/catalog.db"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def engine(tmp_path, db_url: str) -> Iterator[Engine]:
    """An engine on a fresh data directory, on both catalog backends."""
    e = Engine.open(str(tmp_path / "hub"), db_url=db_url, gc_grace=3600)
    yield e
    e.close()


@pytest.fixture
def sqlite_engine(tmp_path) -> Iterator[Engine]:
    """An engine on SQLite only, for tests whose subject is not the catalog."""
    e = Engine.open(str(tmp_path / "hub"), gc_grace=3600)
    yield e
    e.close()


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str

    def json(self):
        return json.loads(self.stdout)


@dataclass
class Cli:
    """Runs the real ``fabric`` command in a subprocess against one data directory."""

    data: str
    env: dict

    def __call__(self, *args: str, input: bytes | None = None, check: bool = True) -> CliResult:
        proc = subprocess.run(
            [sys.executable, "-m", "fabric.cli.main", "--data", self.data, *args],
            input=input,
            capture_output=True,
            env=self.env,
            timeout=600,
        )
        result = CliResult(proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace"))
        if check and proc.returncode != 0:
            raise AssertionError(f"fabric {' '.join(args)} failed ({proc.returncode}): {result.stderr}")
        return result


@pytest.fixture
def cli(tmp_path) -> Cli:
    env = dict(os.environ, PYTHONPATH=ROOT, FABRIC_AUTHOR="tester")
    return Cli(str(tmp_path / "hub"), env)


# -- real hubs over loopback HTTP (tests/hubserver.py) ---------------------------


@pytest.fixture(scope="session")
def hub(tmp_path_factory) -> Iterator[Hub]:
    """One hub (SQLite catalog, auth on) shared by the session; use fresh repo names."""
    with start_hub(tmp_path_factory.mktemp("hub") / "data") as h:
        yield h


@pytest.fixture
def fresh_hub(tmp_path) -> Iterator[Hub]:
    """A hub of its own for one test (SQLite catalog, auth on)."""
    with start_hub(tmp_path / "hub") as h:
        yield h


@pytest.fixture
def pg_hub(tmp_path, pg_url: str) -> Iterator[Hub]:
    """A hub whose catalog is a fresh PostgreSQL database."""
    with start_hub(tmp_path / "pghub", db=pg_url) as h:
        yield h


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def any_hub(request: pytest.FixtureRequest) -> Hub:
    """The shared SQLite hub, then a PostgreSQL one: tests using it run on both catalogs."""
    return request.getfixturevalue("hub" if request.param == "sqlite" else "pg_hub")


# -- real spokes over loopback HTTP (tests/spokeserver.py) -----------------------
from tests.spokeserver import Spoke, start_spoke  # noqa: E402


@pytest.fixture
def cold_spoke_of_hub(hub: Hub, tmp_path) -> Iterator[Spoke]:
    """A spoke of the session hub with a cold 512 MiB cache; its own token (and the default caller's) is the hub admin's."""
    with start_spoke(hub.url, tmp_path / "spoke-cache", "512MiB", token=hub.token) as s:
        yield s
