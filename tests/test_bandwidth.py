"""``--bwlimit`` (the command line, a mount) and ``fabric spoke --hub-bwlimit``
(``fabric/client/bandwidth.py``): the rate parser, the token bucket on a fake clock, and real
transfers against a hub and a spoke on loopback, each taking at least the time its cap allows."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from fabric.client.bandwidth import BURST_SECONDS, TokenBucket, parse_bwlimit
from fabric.client.transfer import import_directory
from fabric.errors import BadRequest
from tests.fuse_helpers import mounted, needs_fuse
from tests.hubserver import hub_env, unique_name
from tests.spokeserver import random_bytes, start_spoke, wait_for

MiB = 1 << 20


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += seconds


def test_a_bucket_paces_what_is_taken_to_its_rate():
    clock = FakeClock()
    bucket = TokenBucket(1000, clock, clock.sleep)
    for _ in range(50):
        bucket.take(100)  # 5,000 bytes at 1,000 a second, less the burst it starts with
    assert clock.slept == pytest.approx(5.0 - BURST_SECONDS, abs=1e-6)
    clock.now += 60  # an idle minute refills no more than the burst
    before = clock.slept
    bucket.take(int(1000 * BURST_SECONDS) + 500)
    assert clock.slept - before == pytest.approx(0.5, abs=1e-6)


def test_a_piece_larger_than_the_bucket_is_paid_for_by_the_next_taker_too():
    clock = FakeClock()
    bucket = TokenBucket(100, clock, clock.sleep)
    bucket.take(1010)  # 10 bytes of burst, then 10 seconds of debt
    assert clock.slept == pytest.approx(10.0)
    bucket.take(100)
    assert clock.slept == pytest.approx(11.0)


def test_a_background_taker_gives_way_to_demand_that_comes_while_it_waits():
    """A spoke's prefetch (background) takes only once the bucket owes nothing: a demand read
    that comes while it waits is paid for first, so the demand never waits behind it."""
    clock = FakeClock()
    asked: list[float] = []  # the background taker's sleeps
    wake = threading.Semaphore(0)

    def sleep(seconds: float) -> None:
        if threading.current_thread().name == "background":
            asked.append(round(seconds, 6))
            wake.acquire()  # until the test moves the clock on
        # a demand taker's own wait is not simulated: its debt stands for it

    bucket = TokenBucket(100, clock, sleep)
    bucket.take(1000)  # demand, 990 bytes owed
    taker = threading.Thread(target=bucket.take, args=(50, True), name="background")
    taker.start()
    wait_for(lambda: len(asked) == 1)
    bucket.take(500)  # more demand while the background taker waits
    clock.now += asked[0]
    wake.release()
    wait_for(lambda: len(asked) == 2)
    assert asked == [9.9, 5.0], "the background taker waits for the demand that came after it"
    clock.now += asked[1]
    wake.release()
    wait_for(lambda: len(asked) == 3)  # its own 50 bytes, taken at last
    assert asked[2] == 0.5
    wake.release()
    taker.join(5)
    assert not taker.is_alive()


@pytest.mark.parametrize(
    "text, up, down",
    [
        ("50M", 50 * MiB, 50 * MiB),
        ("10M:100M", 10 * MiB, 100 * MiB),
        ("off:1G", None, 1 << 30),
        ("1.5K", 1536, 1536),
        ("2MiB/s", 2 * MiB, 2 * MiB),
        ("4096", 4096, 4096),
    ],
)
def test_rates_are_read_as_rclone_writes_them(text, up, down):
    bw = parse_bwlimit(text)
    assert (bw.up.rate if bw.up else None, bw.down.rate if bw.down else None) == (up, down)


@pytest.mark.parametrize("text", ["", "abc", "0", "-1M", "1M:2M:3M", "10X", "M"])
def test_a_rate_that_is_no_rate_is_refused(text):
    with pytest.raises(BadRequest):
        parse_bwlimit(text)


def fabric(hub, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = hub_env({"FABRIC_SERVER": hub.url, "FABRIC_TOKEN": hub.token})
    proc = subprocess.run([sys.executable, "-m", "fabric.cli.main", "-q", *args], capture_output=True, text=True, env=env, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def new_repo_and_source(hub, src, mib: int) -> str:
    """A new repository's name, and ``src/data.bin``: ``mib`` MiB of incompressible bytes."""
    repo = unique_name("bw")
    hub.plane().create_repo(repo)
    src.mkdir()
    (src / "data.bin").write_bytes(random_bytes(mib * MiB, mib))
    return repo


@pytest.fixture
def three_mib(hub, tmp_path):
    """A repository holding one 3 MiB file of incompressible bytes."""
    repo = new_repo_and_source(hub, tmp_path / "src", 3)
    import_directory(hub.plane(), str(tmp_path / "src"), repo, "main", "3 MiB")
    return repo


def test_an_export_is_held_to_the_download_cap(hub, three_mib, tmp_path):
    started = time.monotonic()
    fabric(hub, "--bwlimit", "off:1M", "export", f"{three_mib}@main", str(tmp_path / "out"))
    assert time.monotonic() - started >= 3 - BURST_SECONDS - 0.2  # 3 MiB at 1 MiB/s
    assert (tmp_path / "out" / "data.bin").read_bytes() == (tmp_path / "src" / "data.bin").read_bytes()


def test_an_import_is_held_to_the_upload_cap(hub, tmp_path):
    src = tmp_path / "up"
    repo = new_repo_and_source(hub, src, 2)
    started = time.monotonic()
    fabric(hub, "--bwlimit", "1M:off", "import", str(src), f"{repo}@main", "-m", "capped")
    assert time.monotonic() - started >= 2 - BURST_SECONDS - 0.2


def test_bad_bwlimit_options_are_refused_before_anything_moves(hub, three_mib, tmp_path):
    bad = fabric(hub, "--bwlimit", "fast", "export", f"{three_mib}@main", str(tmp_path / "out"), check=False)
    assert bad.returncode == 2 and "--bwlimit 'fast'" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "out").exists()
    local = subprocess.run(
        [sys.executable, "-m", "fabric.cli.main", "--data", str(tmp_path / "data"), "--bwlimit", "1M", "repo", "list"],
        capture_output=True,
        text=True,
        env=hub_env({}),
        timeout=120,
    )
    assert local.returncode == 2 and "--server" in local.stderr


def test_a_spoke_fetches_from_its_hub_within_its_cap(hub, three_mib, tmp_path):
    with start_spoke(hub.url, tmp_path / "cache", token=hub.token, args=["--hub-bwlimit", "off:1M"]) as spoke:
        started = time.monotonic()
        with spoke.client() as client:
            got = client.get(f"/api/v1/repos/{three_mib}/refs/main/objects", params={"path": "data.bin"})
        assert got.status_code == 200 and len(got.content) == 3 * MiB
        assert time.monotonic() - started >= 3 - BURST_SECONDS - 0.2
        started = time.monotonic()
        with spoke.client() as client:
            assert len(client.get(f"/api/v1/repos/{three_mib}/refs/main/objects", params={"path": "data.bin"}).content) == 3 * MiB
        assert time.monotonic() - started < 2.5, "a warm read does not cross the capped link"


@needs_fuse
def test_a_mount_reads_within_its_cap(hub, three_mib, tmp_path):
    with mounted(hub.url, hub.token, f"{three_mib}@main", tmp_path / "mnt", "--bwlimit", "off:1M") as mp:
        started = time.monotonic()
        with open(os.path.join(mp, "data.bin"), "rb") as f:
            assert len(f.read()) == 3 * MiB
        assert time.monotonic() - started >= 3 - BURST_SECONDS - 0.2
