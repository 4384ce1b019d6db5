"""Tests that need an outside tool (PostgreSQL, FUSE, the S3 client tools).

Where the tool is missing such a test is skipped on a developer's machine, but
under CI (``CI`` set in the environment, as CI services do: ``CI=true``) it
*fails*, naming what is missing: a CI job that silently skips the suites it
cannot run would pass without testing them.

- in a fixture or a test: ``missing(reason)`` (instead of ``pytest.skip``);
- as a mark: ``requires(reason)``, where ``reason`` says why the tool is
  unavailable, or is None when it is there (instead of ``pytest.mark.skipif``);
  ``reason`` may be a function, asked (once) only when a marked test runs.

The mark is enforced by the hooks below, which ``tests/conftest.py`` imports.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import NoReturn

import pytest

MARK = "requires"


def under_ci() -> bool:
    """True when the environment says this is a CI run (``CI`` set, and not to 0/false/no)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing(reason: str) -> NoReturn:
    """A requirement of this test is missing: skip it, or fail it under CI."""
    if under_ci():
        pytest.fail(f"missing test requirement under CI (CI is set, so this fails instead of skipping): {reason}", pytrace=False)
    pytest.skip(reason)


def requires(reason: str | None | Callable[[], str | None]) -> pytest.MarkDecorator:
    """Mark tests that need a tool; ``reason`` is why it is unavailable, None when it is available."""
    # with_args: a mark called with one callable would decorate it instead of taking it as an argument.
    return getattr(pytest.mark, MARK).with_args(functools.cache(reason) if callable(reason) else reason)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARK}(reason): needs an outside tool; skipped without it, failed under CI")


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers(MARK):
        reason = mark.args[0]() if callable(mark.args[0]) else mark.args[0]
        if reason is not None:
            missing(reason)
