"""Which libfuse a mount loads: libfuse 3, also on a machine that has libfuse 2 (s3fs-fuse,
a benchmark peer installed by ``make deps``, pulls it in)."""

from __future__ import annotations

import os
import subprocess
import sys
from ctypes.util import find_library

from tests.fuse_helpers import needs_fuse
from tests.hubserver import ROOT


@needs_fuse
def test_mounts_load_libfuse_3_where_libfuse_2_is_installed_too() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSE_LIBRARY")}
    probe = "import fuse.libfuse, mfusepy; print(mfusepy.fuse_version_major, mfusepy._libfuse_path)"
    out = subprocess.run([sys.executable, "-c", probe], env=env, cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "3" and "fuse3" in out[1], out
    # The case this guards against: mfusepy alone picks libfuse 2 when it is there.
    if find_library("fuse"):
        alone = subprocess.run([sys.executable, "-c", "import mfusepy; print(mfusepy._libfuse_path)"], env=env, cwd=ROOT,
                               capture_output=True, text=True, check=False)
        assert "fuse3" not in alone.stdout
