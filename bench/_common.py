"""Shared helpers of the benchmarks: timed subprocesses, directory sizes, medians, environment."""

from __future__ import annotations

import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Where the fabric package is imported from: the working tree by default, or a
#: pinned snapshot of a revision (run_all.sh --rev) so that edits made to the
#: working tree while a benchmark runs do not change what is measured.
FABRIC_SRC = os.environ.get("FABRIC_SRC") or REPO_ROOT
MB = 1_000_000  # throughput is quoted in MB/s (10^6 bytes), sizes in MiB where said


class Killed(Exception):
    """A command ended by a signal (e.g. another user's ``pkill`` on a shared machine): retry the round."""


MAX_RETRIES = 2


def with_retries(fn, *args):
    """Call ``fn(*args)``; if one of its commands was killed by a signal, run it again (at most MAX_RETRIES)."""
    for attempt in range(MAX_RETRIES + 1):
        try:
            return fn(*args)
        except Killed as exc:
            if attempt == MAX_RETRIES:
                raise SystemExit(str(exc)) from None
            print(f"retrying the round: {exc}", file=sys.stderr, flush=True)
    raise AssertionError("unreachable")


@dataclass
class Timed:
    """One finished command: wall and CPU seconds, peak RSS, exit code, output."""

    cmd: list[str]
    wall: float
    user: float
    sys: float
    maxrss_kib: int
    rc: int
    stdout: str
    stderr: str

    @property
    def cpu(self) -> float:
        return self.user + self.sys


def fabric_cmd(python: str) -> list[str]:
    return [python, "-m", "fabric.cli.main"]


def fabric_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = FABRIC_SRC + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONSAFEPATH"] = "1"  # python -m/-c must not import fabric from the current directory instead
    env.setdefault("FABRIC_AUTHOR", "bench")
    return env


def run_timed(cmd: list[str], cwd: str | None = None, env: dict[str, str] | None = None, sync: bool = True,
              check: bool = True) -> Timed:
    """Run ``cmd`` to completion; wall time from fork to reap, CPU from the kernel's rusage.

    ``sync`` flushes dirty pages first (untimed) so one run's write-back does
    not land in the next run's timing.
    """
    if sync:
        os.sync()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        t = Timed(cmd, wall, ru.ru_utime, ru.ru_stime, ru.ru_maxrss, p.returncode,
                  out.read().decode(errors="replace"), err.read().decode(errors="replace"))
    if check and t.rc < 0:
        raise Killed(f"killed by signal {-t.rc}: {shlex.join(cmd)}")
    if check and t.rc != 0:
        raise SystemExit(f"command failed (exit {t.rc}): {shlex.join(cmd)}\n{t.stderr[-4000:]}{t.stdout[-2000:]}")
    return t


def run(cmd: list[str], cwd: str | None = None, env: dict[str, str] | None = None) -> str:
    """An untimed setup command; its stdout."""
    p = subprocess.run(cmd, check=False, cwd=cwd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"command failed (exit {p.returncode}): {shlex.join(cmd)}\n{p.stderr[-4000:]}")
    return p.stdout


def dir_size(path: str) -> dict[str, int]:
    """Apparent bytes (sum of st_size, as ``du -sb``) and allocated bytes (``du -s``) of a tree."""
    apparent = allocated = files = 0
    for dirpath, dirnames, names in os.walk(path):
        for n in names + dirnames:
            st = os.lstat(os.path.join(dirpath, n))
            allocated += st.st_blocks * 512
            if n in names:
                apparent += st.st_size
                files += 1
    return {"apparent": apparent, "allocated": allocated, "files": files}


def remove(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def spread(xs: list[float]) -> str:
    """``median (min..max)`` for a list of seconds or rates."""
    return f"{median(xs):.2f} ({min(xs):.2f}..{max(xs):.2f})"


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages, as ``/proc/loadavg`` shows them."""
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def machine() -> dict:
    info = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "host_cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            info["mem_gib"] = round(int(f.readline().split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    info["fabric_commit"] = fabric_revision()
    if shutil.which("restic"):
        info["restic"] = run(["restic", "version"]).strip()
    return info


def fabric_revision() -> str:
    """The revision measured: the pinned snapshot's, or the working tree's HEAD (+ dirty flag)."""
    if os.environ.get("FABRIC_REV"):
        return f"{os.environ['FABRIC_REV']} (snapshot in {FABRIC_SRC})"
    try:
        rev = subprocess.run(["git", "-C", REPO_ROOT, "rev-parse", "--short", "HEAD"],
                             check=False, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO_ROOT, "status", "--porcelain", "--untracked-files=no", "--", "fabric"],
                               check=False, capture_output=True, text=True).stdout.strip()
    except OSError:
        return "?"
    return rev + (" + uncommitted changes under fabric/" if dirty else "")


def save_json(path: str, data: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True, default=str)
        f.write("\n")


def save_report(text: str, data: dict, json_out: str | None, md_out: str | None) -> None:
    """A benchmark's results: ``data`` as JSON to ``json_out``, its rendered ``text`` to ``md_out`` (each if given)."""
    if json_out:
        save_json(json_out, data)
    if md_out:
        os.makedirs(os.path.dirname(os.path.abspath(md_out)), exist_ok=True)
        with open(md_out, "w") as f:
            f.write(text)


def last_json_line(text: str, key: str | None = None, value: str | None = None) -> dict:
    """The last line of ``text`` that parses as a JSON object (optionally with ``key == value``)."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if key is None or obj.get(key) == value:
            return obj
    raise SystemExit(f"no JSON result in output:\n{text[-2000:]}")


def stop_process(proc: subprocess.Popen | None) -> None:
    """End a server this benchmark started (by its own PID only): SIGTERM, then SIGKILL after 15 s."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def unmount(mp: str) -> None:
    """Unmount a FUSE mount point: cleanly if it can, lazily if it is busy; nothing if not mounted."""
    for cmd in (["fusermount3", "-u", mp], ["fusermount3", "-u", "-z", mp]):
        if not os.path.ismount(mp):
            return
        subprocess.run(cmd, capture_output=True, check=False)
        time.sleep(0.3)


def read_sequential(path: str) -> int:
    """Read the file at ``path`` from start to end, 1 MiB at a time into one buffer; its bytes."""
    view = memoryview(bytearray(1 << 20))
    n = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while got := os.readv(fd, [view]):
            n += got
        return n
    finally:
        os.close(fd)


def drop_page_cache() -> bool:
    """Write back and drop the kernel's page cache (root only), so that a read comes from the
    disk or the network; whether it was dropped.

    It also keeps a benchmark's own removals from slowing what it writes next. On ext4 without
    a journal (this project's machines), a new file skips every inode freed in the last
    minutes whose table block is still cached: after a removal of 20,000 files, each of the
    next 20,000 files of 64 KiB took 110-220 us to make, about 55 once those blocks were
    written back and dropped (bench/RESULTS.md, "The benchmarks' own deletions")."""
    if os.geteuid() != 0:
        return False
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False
