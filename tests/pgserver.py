"""A throwaway PostgreSQL server for tests.

    with start_postgres() as url:          # postgresql://fabric@127.0.0.1:PORT/fabric
        db = fresh_database(url)           # postgresql://fabric@127.0.0.1:PORT/t_<hex>

The server lives in a temporary directory, listens on a free port on
127.0.0.1 only (its unix socket sits inside the temporary directory), trusts
every connection from 127.0.0.1, runs with fsync and friends off, and is
stopped (``pg_ctl stop -m immediate``) and deleted on exit.

PostgreSQL refuses to run as root. When the tests run as root (CI does), the
server runs as the system user ``fabricpg``, created on first use with
``useradd --system --no-create-home``, and initdb/pg_ctl are run through
``runuser -u fabricpg --`` (or ``su``). Clients connect over TCP, so the test
process needs no special rights.

Binaries are found through ``$FABRIC_PG_BINDIR`` (when set, only there),
else ``pg_config --bindir``, ``/usr/lib/postgresql/*/bin`` (newest first),
then ``$PATH``. Setting
``FABRIC_TEST_POSTGRES_URL`` makes ``start_postgres()`` yield that URL instead
of starting a server (the role behind it must be allowed to CREATE DATABASE
for ``fresh_database``).

Use from a conftest.py (``tests/`` has no ``__init__.py``, so pytest puts
``tests/`` on ``sys.path`` and this module imports as ``pgserver``)::

    import pytest
    from ci_requirements import missing
    from pgserver import (drop_database, fresh_database, postgres_available,
                          postgres_unavailable_reason, start_postgres)

    @pytest.fixture(scope="session")
    def pg_server():
        if not postgres_available():
            missing(postgres_unavailable_reason())   # a skip; a failure under CI
        with start_postgres() as url:
            yield url

    @pytest.fixture
    def pg_url(pg_server):
        url = fresh_database(pg_server)   # a new, empty database per test
        yield url
        drop_database(url)                # optional: the server goes away anyway

Tests that use them should carry ``@pytest.mark.postgres`` (declared in
pyproject.toml). Starting a server costs about a second (initdb); a fresh
database costs tens of milliseconds, so share the server, not the database.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

__all__ = [
    "PG_OS_USER",
    "PG_SUPERUSER",
    "PG_DATABASE",
    "find_bindir",
    "postgres_available",
    "postgres_unavailable_reason",
    "start_postgres",
    "fresh_database",
    "drop_database",
]

PG_OS_USER = "fabricpg"  # OS account the server runs as when we are root
PG_SUPERUSER = "fabric"  # database superuser created by initdb
PG_DATABASE = "fabric"  # database the yielded URL points at

_ENV_URL = "FABRIC_TEST_POSTGRES_URL"
_ENV_BINDIR = "FABRIC_PG_BINDIR"
_NEEDED = ("initdb", "pg_ctl", "postgres")

# Settings for a disposable server: durability off, small footprint, quiet.
_SERVER_SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "wal_level": "minimal",
    "max_wal_senders": "0",
    "max_wal_size": "1GB",
    "checkpoint_timeout": "1h",
    "shared_buffers": "64MB",
    "max_connections": "200",
    "autovacuum": "off",
    "jit": "off",
    "log_min_messages": "warning",
    "log_checkpoints": "off",
    "timezone": "'UTC'",
    "datestyle": "'iso, mdy'",
}


# --------------------------------------------------------------------------
# discovery


def _version_key(path: str) -> tuple[int, ...]:
    m = re.search(r"/postgresql/(\d+)(?:\.(\d+))?/", path)
    return tuple(int(g) for g in m.groups() if g) if m else (0,)


def _has_all(bindir: str) -> bool:
    return all(os.access(os.path.join(bindir, b), os.X_OK) for b in _NEEDED)


def find_bindir() -> str | None:
    """Directory holding initdb, pg_ctl and postgres, or None."""
    env = os.environ.get(_ENV_BINDIR)
    if env:  # an explicit setting is the only place looked at: a wrong one is reported, not papered over
        return env if _has_all(env) else None
    candidates: list[str] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10
            )
            if out.returncode == 0 and out.stdout.strip():
                candidates.append(out.stdout.strip())
        except (OSError, subprocess.SubprocessError):
            pass
    candidates += sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True
    )
    candidates += sorted(glob.glob("/usr/pgsql-*/bin"), reverse=True)  # RHEL layout
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(os.path.dirname(os.path.realpath(initdb)))
        candidates.append(os.path.dirname(initdb))
    for c in candidates:
        if _has_all(c):
            return c
    return None


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def postgres_unavailable_reason() -> str | None:
    """Why no throwaway server can be started here, or None when one can."""
    if os.environ.get(_ENV_URL):
        return None
    if find_bindir() is None:
        if os.environ.get(_ENV_BINDIR):
            return f"{_ENV_BINDIR}={os.environ[_ENV_BINDIR]} does not hold the PostgreSQL server binaries ({', '.join(_NEEDED)})"
        return (
            "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found; "
            "install the 'postgresql' package (scripts/install-system-deps.sh "
            f"does it when run as root) or set {_ENV_BINDIR}"
        )
    if _is_root():
        if not (shutil.which("runuser") or shutil.which("su")):
            return "running as root and neither runuser nor su is available"
        if not _user_exists(PG_OS_USER) and not shutil.which("useradd"):
            return f"running as root, user {PG_OS_USER!r} is missing and there is no useradd"
    return None


def postgres_available() -> bool:
    """True when start_postgres() can be expected to work."""
    return postgres_unavailable_reason() is None


# --------------------------------------------------------------------------
# running commands (as the server's OS user when we are root)


def _ensure_os_user() -> None:
    if _user_exists(PG_OS_USER):
        return
    r = subprocess.run(
        ["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
         "--shell", "/usr/sbin/nologin", "--user-group", PG_OS_USER],
        capture_output=True, text=True,
    )
    # A concurrent test process may have created it first (useradd exits 9).
    if not _user_exists(PG_OS_USER):
        raise RuntimeError(
            f"useradd {PG_OS_USER} failed (exit {r.returncode}): {r.stderr.strip()}"
        )


def _as_server_user(argv: list[str]) -> list[str]:
    if not _is_root():
        return argv
    if shutil.which("runuser"):
        return ["runuser", "-u", PG_OS_USER, "--", *argv]
    return ["su", "-s", "/bin/sh", PG_OS_USER, "-c", shlex.join(argv)]


def _run(argv: list[str], cwd: str, timeout: float = 120) -> subprocess.CompletedProcess:
    # Drop PG* variables (PGHOST, PGPORT, PGDATA...) so they can't redirect us.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env.update(LC_ALL="C", LANG="C", TZ="UTC")
    return subprocess.run(
        _as_server_user(argv), cwd=cwd, env=env, capture_output=True, text=True,
        timeout=timeout, stdin=subprocess.DEVNULL,
    )


def _tail(log: Path) -> str:
    if not log.exists():
        return ""
    return f"\n--- {log} ---\n" + log.read_text(errors="replace")[-4000:]


def _check(r: subprocess.CompletedProcess, what: str, log: Path | None = None) -> None:
    if r.returncode != 0:
        raise RuntimeError(
            f"{what} failed (exit {r.returncode})\n{r.stdout}{r.stderr}"
            + (_tail(log) if log is not None else "")
        )


def _traversable_by_others(path: str) -> bool:
    p = Path(path).resolve()
    return all(os.stat(d).st_mode & 0o001 for d in [p, *p.parents])


def _base_tmpdir() -> str:
    base = tempfile.gettempdir()
    if _is_root() and not _traversable_by_others(base):
        base = "/tmp"  # e.g. TMPDIR under /root: the server user could not reach it
    return base


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_accepting(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _kill_postmaster(data: str) -> None:
    try:
        pid = int(Path(data, "postmaster.pid").read_text().split()[0])
        os.kill(pid, 9)
    except (OSError, ValueError, IndexError):
        pass


# --------------------------------------------------------------------------
# the server


@contextlib.contextmanager
def start_postgres() -> Iterator[str]:
    """Start a throwaway server; yield ``postgresql://fabric@127.0.0.1:PORT/fabric``."""
    external = os.environ.get(_ENV_URL)
    if external:
        yield external
        return

    reason = postgres_unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    bindir = find_bindir()
    assert bindir is not None
    initdb = os.path.join(bindir, "initdb")
    pg_ctl = os.path.join(bindir, "pg_ctl")
    psql = os.path.join(bindir, "psql")

    if _is_root():
        _ensure_os_user()
    top = tempfile.mkdtemp(prefix="fabric-pg-", dir=_base_tmpdir())
    data = os.path.join(top, "data")
    sock = os.path.join(top, "sock")
    log = Path(top) / "server.log"
    started = False
    try:
        os.mkdir(sock)
        if _is_root():
            ent = pwd.getpwnam(PG_OS_USER)
            for p in (top, sock):
                os.chown(p, ent.pw_uid, ent.pw_gid)
        os.chmod(top, 0o700)

        base = [initdb, "-D", data, "-U", PG_SUPERUSER, "--auth=trust", "-E", "UTF8",
                "--locale=C", "--no-sync"]
        r = _run([*base, "--no-instructions"], cwd=top)
        if r.returncode != 0 and "no-instructions" in r.stderr:  # PostgreSQL < 14
            r = _run(base, cwd=top)
        _check(r, "initdb")

        # Rewrite files initdb made (truncating keeps the server user as owner).
        with open(os.path.join(data, "pg_hba.conf"), "w") as f:
            f.write(
                "# throwaway test server: trust on loopback and on its private socket\n"
                "local all all trust\n"
                "host  all all 127.0.0.1/32 trust\n"
            )
        settings = dict(_SERVER_SETTINGS, listen_addresses="'127.0.0.1'",
                        unix_socket_directories=f"'{sock}'")

        port = 0
        last = ""
        for _attempt in range(5):  # someone may grab the free port before we bind it
            port = _free_port()
            with open(os.path.join(data, "postgresql.auto.conf"), "w") as f:
                f.write("# written by tests/pgserver.py\n")
                f.writelines(f"{k} = {v}\n" for k, v in {**settings, "port": port}.items())
            if log.exists():
                log.unlink()
            r = _run([pg_ctl, "-D", data, "-l", str(log), "-w", "-t", "60", "start"],
                     cwd=top)
            if r.returncode == 0:
                started = True
                break
            last = f"pg_ctl start failed (exit {r.returncode})\n{r.stdout}{r.stderr}{_tail(log)}"
            _kill_postmaster(data)
            text = log.read_text(errors="replace") if log.exists() else ""
            if "could not bind" not in text and "already in use" not in text:
                break
        if not started:
            raise RuntimeError(last)
        _wait_accepting(port)

        url = f"postgresql://{PG_SUPERUSER}@127.0.0.1:{port}/{PG_DATABASE}"
        if os.access(psql, os.X_OK):
            r = _run([psql, "-X", "-q", "-h", sock, "-p", str(port), "-U", PG_SUPERUSER,
                      "-d", "postgres", "-v", "ON_ERROR_STOP=1",
                      "-c", f'CREATE DATABASE "{PG_DATABASE}"'], cwd=top)
            _check(r, "CREATE DATABASE", log)
        else:
            _create_database(_with_dbname(url, "postgres"), PG_DATABASE)
        yield url
    finally:
        if started:
            r = _run([pg_ctl, "-D", data, "-m", "immediate", "-w", "-t", "30", "stop"],
                     cwd=top)
            if r.returncode != 0:
                _kill_postmaster(data)
        shutil.rmtree(top, ignore_errors=True)


# --------------------------------------------------------------------------
# databases


def _with_dbname(url: str, dbname: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + dbname))


def _create_database(admin_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')


def fresh_database(url: str, prefix: str = "t") -> str:
    """Create a new, empty, uniquely named database on url's server; return its URL."""
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,20}", prefix):
        raise ValueError(f"bad database name prefix {prefix!r}")
    name = f"{prefix}_{uuid.uuid4().hex}"
    _create_database(url, name)
    return _with_dbname(url, name)


def drop_database(url: str) -> None:
    """Drop the database url points at (connecting to 'postgres' to do it)."""
    import psycopg

    name = urlsplit(url).path.lstrip("/")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or name in ("postgres",
                                                                    "template0",
                                                                    "template1"):
        raise ValueError(f"refusing to drop database {name!r}")
    with psycopg.connect(_with_dbname(url, "postgres"), autocommit=True,
                         connect_timeout=10) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
