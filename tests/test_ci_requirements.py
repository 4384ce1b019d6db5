"""Under CI a missing PostgreSQL, FUSE or S3 tool fails the run; elsewhere it skips the tests
that need it. Each case runs pytest in a subprocess on a tiny generated test file, with the
tool made unreachable through its setting (a nonexistent location)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.hubserver import ROOT

GENERATED = textwrap.dedent(
    """
    from tests.fuse_helpers import needs_fuse
    from tests.s3_helpers import needs_s3fs


    def test_postgres(pg_url):
        pass


    @needs_fuse
    def test_fuse():
        pass


    @needs_s3fs
    def test_s3fs():
        pass
    """
)

#: Each tool, and the environment in which it is missing (its setting points nowhere).
CASES = {
    "postgres": {"FABRIC_PG_BINDIR": "/nonexistent/pg/bin"},
    "fuse": {"PATH": "/nonexistent/bin"},  # no fusermount3
    "s3fs": {"FABRIC_S3_TOOLS": "/nonexistent/s3tools-venv"},
}


def run_generated(tmp_path, tool: str, ci: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F403 - the suite's fixtures and hooks\n")
    (tmp_path / "test_generated.py").write_text(GENERATED)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "FABRIC_TEST_POSTGRES_URL")}
    env.update(CASES[tool], PYTHONPATH=ROOT)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-k", f"test_{tool}", str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip


@pytest.mark.parametrize("tool", sorted(CASES))
def test_a_missing_tool_fails_the_run_under_ci(tmp_path, tool: str) -> None:
    r = run_generated(tmp_path, tool, ci="true")
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "missing test requirement under CI" in out, out
    assert "skipped" not in out.splitlines()[-1], out


@pytest.mark.parametrize("tool", sorted(CASES))
def test_a_missing_tool_skips_outside_ci(tmp_path, tool: str) -> None:
    for ci in (None, "false"):
        r = run_generated(tmp_path, tool, ci=ci)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        assert "1 skipped" in out.splitlines()[-1], out
