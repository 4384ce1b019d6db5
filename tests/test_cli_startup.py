"""The ``fabric`` command starts cheaply: parsing and ``--help`` import no heavy module.

``fabric --version``, ``fabric --help`` and the parse path of every command
must not import httpx, the engine, the client, rich, the compressors and
hashes, the web stack, libfuse or a service package: those are imported inside
the command functions when they run, and service commands (entry points of the
group ``fabric.commands``) only when invoked. These tests fail when someone
adds a top-level heavy import back. They never assert wall times: the timings
are ``bench/bench_cli_startup.py``'s (figures in ``bench/RESULTS.md``).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import tomllib

import click
import pytest

import fabric
from fabric.cli.main import SERVICE_COMMANDS, cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Modules (and their submodules) that must not be imported to start, parse or print help.
HEAVY = (
    "httpx", "httpcore", "h11", "fastapi", "uvicorn", "starlette", "pydantic", "mfusepy", "boto3", "botocore",
    "zstandard", "blake3", "pyfastcdc", "xxhash", "msgpack", "rich", "pygments", "psycopg", "tqdm", "fsspec",
    "prometheus_client", "grpc", "importlib.metadata",
    "fabric.engine", "fabric.client", "fabric.catalog", "fabric.store", "fabric.api", "fabric.plane",
    "fabric.format.ingest", "fabric.format.chunking", "fabric.format.frames", "fabric.format.packs",
    "hub", "spoke", "fuse", "csi", "testbed",
)


def _pyproject() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def _modules_after(code: str) -> set[str]:
    """``sys.modules`` of a fresh interpreter after ``code``, less those of a bare interpreter."""

    def run(source: str) -> set[str]:
        tail = "\nimport json as _j, sys as _s\n_s.__stdout__.write('\\nMODULES ' + _j.dumps(sorted(k for k, v in _s.modules.items() if v is not None)) + '\\n')\n"
        r = subprocess.run([sys.executable, "-c", source + tail], capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert r.returncode == 0, r.stderr
        line = [ln for ln in r.stdout.splitlines() if ln.startswith("MODULES ")][-1]
        return set(json.loads(line[len("MODULES "):]))

    return run(code) - run("pass")


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def test_importing_the_command_imports_nothing_heavy() -> None:
    loaded = _modules_after("import fabric.cli.main")
    assert not _heavy(loaded), f"`import fabric.cli.main` imports heavy modules at start: {_heavy(loaded)}"


def _help_paths() -> list[list[str]]:
    """``--help`` of the group and of every core command and sub-command."""
    paths: list[list[str]] = [[]]
    for name, command in sorted(cli.commands.items()):
        paths.append([name])
        if isinstance(command, click.Group):
            paths.extend([name, sub] for sub in sorted(command.commands))
    return paths


def test_version_help_and_parsing_import_nothing_heavy() -> None:
    runs = [["--version"], *[[*p, "--help"] for p in _help_paths()],
            # global options parsed before a command's --help: still nothing contacted or imported
            ["--server", "http://127.0.0.1:9", "--token", "t", "--json", "repo", "list", "--help"],
            ["--data", "/nonexistent", "ls", "--help"]]
    code = (
        "from click.testing import CliRunner\n"
        "from fabric.cli.main import cli\n"
        f"for args in {runs!r}:\n"
        "    r = CliRunner().invoke(cli, args, prog_name='fabric')\n"
        "    assert r.exit_code == 0 and r.output, (args, r.output, r.exception)\n"
    )
    loaded = _modules_after(code)
    assert not _heavy(loaded), f"--version/--help/parsing import heavy modules: {_heavy(loaded)}"


def test_the_fabric_process_imports_nothing_heavy_for_help() -> None:
    """The real entry point (``main()``), as the ``fabric`` script runs it."""
    for args in (["--version"], ["--help"], ["ls", "--help"]):
        code = f"import sys\nsys.argv = ['fabric', *{args!r}]\nfrom fabric.cli.main import main\ntry:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        loaded = _modules_after(code)
        assert not _heavy(loaded), f"fabric {' '.join(args)} imports heavy modules: {_heavy(loaded)}"


def test_version_constant_is_pyprojects() -> None:
    assert fabric.__version__ == _pyproject()["project"]["version"]
    r = subprocess.run([sys.executable, "-m", "fabric.cli.main", "--version"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"fabric, version {fabric.__version__}", r.stdout + r.stderr


def _entry_points() -> dict[str, str]:
    return _pyproject()["project"]["entry-points"]["fabric.commands"]


def test_service_help_registry_matches_the_entry_points() -> None:
    """SERVICE_COMMANDS has one line per entry point, equal to the command's own short help."""
    entry_points = _entry_points()
    assert set(SERVICE_COMMANDS) == set(entry_points), "update SERVICE_COMMANDS in fabric/cli/main.py with pyproject.toml's fabric.commands"
    assert not set(entry_points) & set(cli.commands), "a service command shadows a core command"
    for name, target in entry_points.items():
        module, _, attr = target.partition(":")
        try:
            command = getattr(importlib.import_module(module), attr)
        except ImportError as exc:  # an optional extra (e.g. csi's grpcio) missing here
            pytest.skip(f"cannot import {target}: {exc}")
        assert isinstance(command, click.Command) and command.name == name, target
        assert SERVICE_COMMANDS[name] == command.get_short_help_str(10_000), f"SERVICE_COMMANDS[{name!r}] differs from `fabric {name}`'s help"


def test_help_lists_every_command() -> None:
    r = subprocess.run([sys.executable, "-m", "fabric.cli.main", "--help"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    listed = dict(re.findall(r"^  (\S+)\s+(\S.*)$", r.stdout.split("\nCommands:\n", 1)[1], re.MULTILINE))
    expected = set(cli.commands) | set(_entry_points())
    assert {"hub", "spoke", "mount", "umount", "wan-proxy", "csi"} <= expected
    assert set(listed) == expected, f"missing: {sorted(expected - set(listed))}, extra: {sorted(set(listed) - expected)}"
    for name in _entry_points():
        first_words = " ".join(SERVICE_COMMANDS[name].split()[:3])
        assert listed[name].startswith(first_words), (name, listed[name])


@pytest.mark.parametrize("name", ["hub", "spoke", "mount", "umount", "wan-proxy"])
def test_service_commands_still_load_when_invoked(name: str) -> None:
    r = subprocess.run([sys.executable, "-m", "fabric.cli.main", name, "--help"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"Usage: fabric {name} "), r.stdout


def test_unknown_command_is_a_usage_error() -> None:
    r = subprocess.run([sys.executable, "-m", "fabric.cli.main", "no-such-command"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 2 and "No such command" in r.stderr, r.stderr
