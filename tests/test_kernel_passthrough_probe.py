"""bench/kernel_passthrough.py, the FUSE server bench_fuse.py measures as a ceiling: it serves
a directory's files whole and unchanged, with or without the kernel's passthrough, and
nothing outside the directory."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time

import pytest

from fuse.kernel.protocol import kernel_has_passthrough

PROBE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "kernel_passthrough.py")


MODES = ["reads"] + (["passthrough"] if kernel_has_passthrough() else [])


@pytest.mark.parametrize("mode", MODES)
def test_the_probe_serves_the_directory_and_nothing_outside_it(tmp_path, mode):
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    (src / "sub").mkdir(parents=True)
    mnt.mkdir()
    data = os.urandom(3 << 20)
    (src / "big.bin").write_bytes(data)
    (src / "sub" / "small.txt").write_text("nested\n")
    (tmp_path / "secret").write_text("outside\n")
    os.symlink(tmp_path / "secret", src / "link")
    cmd = [sys.executable, PROBE, str(src), str(mnt)] + (["--no-passthrough"] if mode == "reads" else [])
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(mnt):
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "not mounted within 30 s"
            time.sleep(0.05)
        assert sorted(os.listdir(mnt)) == ["big.bin", "sub"]
        assert (mnt / "big.bin").read_bytes() == data
        assert (mnt / "sub" / "small.txt").read_text() == "nested\n"
        assert not os.path.lexists(mnt / "link")
        with pytest.raises(OSError) as refused:
            (mnt / "big.bin").write_bytes(b"x")
        assert refused.value.errno == errno.EROFS
        assert (src / "big.bin").read_bytes() == data
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    if mode == "passthrough":
        assert "passthrough True, 0 READ requests answered" in err  # every read went to the source file in the kernel
    else:
        assert "passthrough False" in err and " 0 READ" not in err
