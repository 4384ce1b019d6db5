"""Issue 15's whole setup: two hub processes on one PostgreSQL catalog and one S3 (moto)
pack store, and spokes in a group, each with both hubs in its ``--hub`` list.

Every spoke reaches each hub through a WAN proxy of its own (testbed's ``WanProxy``), so
the bytes that cross the WAN are counted where they cross. Hub A is the one killed
(SIGKILL); each test that kills it starts its own, while hub B, the catalog and the
store are shared by the module.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from botocore.exceptions import BotoCoreError, ClientError

from fabric.client.http import HttpPlane
from fabric.util.groups import member_url
from spoke.group import owner
from testbed.wanproxy import WanProxy
from tests.hubserver import unique_name
from tests.multihub import Backing, backing
from tests.s3_helpers import Creds, S3Hub
from tests.spokeserver import Dataset, Spoke, random_dataset, start_spoke, wait_for

MiB = 1 << 20

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(240)]


@dataclass
class Shared(Backing):
    """The catalog, the pack store and hub B, shared by the module's tests; ``start_hub`` starts
    a hub A of its own on the same catalog and store."""

    b: S3Hub
    creds: Creds  # an admin token and its S3 key pair, valid at every hub


@pytest.fixture(scope="module")
def shared(pg_server: str, s3_endpoint: str, tmp_path_factory) -> Iterator[Shared]:
    with backing(pg_server, s3_endpoint, tmp_path_factory, "scaleout") as back, back.start_hub("b") as b:
        yield Shared(back.db, back.store, back.tmp, b, b.token(admin=True, name="scale-admin"))


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _kill(hub: S3Hub) -> None:
    os.kill(hub.hub.proc.pid, signal.SIGKILL)
    hub.hub.proc.wait(10)


# -- bucket locations live in the catalog --------------------------------------------------------


def test_a_bucket_location_set_through_hub_a_is_answered_by_hub_b(shared: Shared) -> None:
    with shared.start_hub("loc-a") as a:
        sa, sb = a.boto3(shared.creds), shared.b.boto3(shared.creds)
        bucket = unique_name("loc")
        sa.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
        assert sb.get_bucket_location(Bucket=bucket)["LocationConstraint"] == "eu-west-1"
        assert sb.head_bucket(Bucket=bucket)["ResponseMetadata"]["HTTPHeaders"]["x-amz-bucket-region"] == "eu-west-1"
        plain = unique_name("loc")
        sb.create_bucket(Bucket=plain)
        assert sa.get_bucket_location(Bucket=plain)["LocationConstraint"] is None  # us-east-1, S3's way
        # A constraint S3 refuses changes nothing at any hub.
        bad = unique_name("loc")
        with pytest.raises(ClientError) as exc:
            sa.create_bucket(Bucket=bad, CreateBucketConfiguration={"LocationConstraint": "not a region!"})
        assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
        with pytest.raises(ClientError):
            sb.head_bucket(Bucket=bad)
        # Deleted through B, re-created through A without a constraint: no stale location.
        sb.delete_bucket(Bucket=bucket)
        sa.create_bucket(Bucket=bucket)
        assert sb.get_bucket_location(Bucket=bucket)["LocationConstraint"] is None


# -- a hub killed mid-upload: the client retries on the other --------------------------------------


def test_a_put_through_a_server_list_survives_hub_a_killed_mid_body(shared: Shared, tmp_path) -> None:
    repo = unique_name("kput")
    shared.b.plane().create_repo(repo)
    data = os.urandom(24 * MiB)
    src = tmp_path / "ckpt.bin"
    src.write_bytes(data)
    with shared.start_hub("put-a") as a, \
            WanProxy("127.0.0.1", _port(a.url), rate_mbit=40, handshake=False) as wan_a, \
            WanProxy("127.0.0.1", _port(shared.b.url), delay_ms_up=30, delay_ms_down=30, handshake=False) as wan_b:
        plane = HttpPlane(f"{wan_a.url_for()},{wan_b.url_for()}", shared.creds.token)
        # B is 60 ms further: A is the nearest even on a loaded host (as a tie, A could lose to jitter).
        assert plane.servers.current() == wan_a.url_for()
        killed = threading.Event()

        def killer() -> None:
            wait_for(lambda: wan_a.bytes_up > 6 * MiB or None, timeout=60, interval=0.02)
            _kill(a)
            killed.set()

        t = threading.Thread(target=killer)
        t.start()
        with open(src, "rb") as f:
            started = time.monotonic()
            entry = plane.put_object(repo, "main", "ckpt.bin", f)
            took = time.monotonic() - started
        t.join(60)
        assert killed.is_set() and wan_a.bytes_up < len(data), "hub A was not killed mid-body"
        assert entry.size == len(data)
        print(f"put of 24 MiB across hub A's kill: {took:.2f} s, {wan_a.bytes_up / MiB:.1f} MiB had gone to A")
        plane.close()
    b = shared.b.plane()
    assert [c.path for c in b.uncommitted(repo, "main")] == ["ckpt.bin"]  # stored once
    b.commit(repo, "main", "checkpoint")
    assert [p for p, _ in b.list(repo, "main").entries] == ["ckpt.bin"]
    assert hashlib.sha256(b"".join(b.read_stream(repo, "main", "ckpt.bin"))).digest() == hashlib.sha256(data).digest()
    assert shared.fsck()["ok"] is True


def test_a_multipart_part_cut_at_hub_a_is_retried_at_hub_b(shared: Shared) -> None:
    repo = unique_name("kmp")
    shared.b.plane().create_repo(repo)
    parts = [os.urandom(5 * MiB), os.urandom(16 * MiB), b"tail"]
    key = "main/big.bin"
    sb = shared.b.boto3(shared.creds)
    with shared.start_hub("mp-a") as a, WanProxy("127.0.0.1", _port(a.s3_url), rate_mbit=40, handshake=False) as wan:
        sa = dataclasses.replace(a, s3_url=wan.url_for()).boto3(shared.creds)
        up = sa.create_multipart_upload(Bucket=repo, Key=key)["UploadId"]
        etags = {1: sa.upload_part(Bucket=repo, Key=key, UploadId=up, PartNumber=1, Body=parts[0])["ETag"]}
        sent = wan.bytes_up

        def killer() -> None:
            wait_for(lambda: wan.bytes_up > sent + 4 * MiB or None, timeout=60, interval=0.02)
            _kill(a)

        t = threading.Thread(target=killer)
        t.start()
        with pytest.raises((ClientError, BotoCoreError)) as cut:
            sa.upload_part(Bucket=repo, Key=key, UploadId=up, PartNumber=2, Body=parts[1])
        t.join(60)
        assert a.hub.proc.poll() is not None, f"the part went through before hub A died: {cut.value!r}"
    # The test retries the part at hub B; the upload goes on there.
    etags[2] = sb.upload_part(Bucket=repo, Key=key, UploadId=up, PartNumber=2, Body=parts[1])["ETag"]
    etags[3] = sb.upload_part(Bucket=repo, Key=key, UploadId=up, PartNumber=3, Body=parts[2])["ETag"]
    listed = sb.list_parts(Bucket=repo, Key=key, UploadId=up)["Parts"]
    assert [(p["PartNumber"], p["ETag"], p["Size"]) for p in listed] == [(n, etags[n], len(parts[n - 1])) for n in (1, 2, 3)]
    done = sb.complete_multipart_upload(
        Bucket=repo, Key=key, UploadId=up, MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in etags.items()]}
    )
    assert done["ETag"].endswith('-3"')
    assert sb.get_object(Bucket=repo, Key=key)["Body"].read() == b"".join(parts)
    plane = shared.b.plane()
    assert [c.path for c in plane.uncommitted(repo, "main")] == ["big.bin"]
    plane.commit(repo, "main", "multipart")
    assert [p for p, _ in plane.list(repo, "main").entries] == ["big.bin"]
    assert shared.fsck()["ok"] is True


# -- the whole setup: two hubs, three spokes in a group --------------------------------------------


@dataclass
class Member:
    spoke: Spoke
    wans: list[WanProxy]  # to hub A, to hub B


def _wan(members: list[Member], hub: int | None = None) -> int:
    """WAN bytes of every spoke (to hub ``hub`` only: 0 for A, 1 for B)."""
    return sum(w.bytes_up + w.bytes_down for m in members for k, w in enumerate(m.wans) if hub in (None, k))


def _read_all(members: list[Member], data: Dataset, at_file: threading.Event | None = None) -> list[float]:
    """Three readers, one per spoke, each reading the whole dataset from a different third;
    every byte checked. Sets ``at_file`` when the first reader has read two files.
    The longest single file read of each reader, in seconds."""
    paths = sorted(data.files)
    third = len(paths) // 3

    def reader(i: int) -> float:
        plane = members[i].spoke.plane()
        longest = 0.0
        try:
            for k, path in enumerate(paths[third * i :] + paths[: third * i]):
                started = time.monotonic()
                got = b"".join(plane.read_stream(data.repo, data.commit, path))
                longest = max(longest, time.monotonic() - started)
                assert hashlib.sha256(got).digest() == hashlib.sha256(data.files[path]).digest(), path
                if at_file is not None and i == 0 and k == 1:
                    at_file.set()
        finally:
            plane.close()
        return longest

    with concurrent.futures.ThreadPoolExecutor(len(members)) as pool:
        return list(pool.map(reader, range(len(members))))


def test_two_hubs_three_spokes_one_group(shared: Shared, tmp_path) -> None:
    group = unique_name("region")
    spoke_token = shared.b.plane(shared.creds.token).create_token(unique_name("so-spoke"), roles={"*": "read"}, rights=["spoke"])["token"]
    with shared.start_hub("group-a") as a, contextlib.ExitStack() as stack:
        members: list[Member] = []
        for i in range(3):
            # Hub B is the farther one (30 ms more round trip): a cold hub A's first probe, slowed by
            # three spokes starting on two CPUs, must not make B the nearest for the whole test.
            wans = [
                stack.enter_context(WanProxy("127.0.0.1", _port(h.url), delay_ms_up=delay, delay_ms_down=delay, rate_mbit=200, handshake=False))
                for h, delay in ((a, 0), (shared.b, 15))
            ]
            spoke = stack.enter_context(start_spoke(
                ",".join(w.url_for() for w in wans), tmp_path / f"spoke{i}", "256MiB", token=spoke_token, group=group,
                args=["--log-level", "warning"],
            ))
            members.append(Member(spoke, wans))

        def views() -> list[str] | None:
            lists = [m.spoke.stats()["group"]["members"] for m in members]
            return lists[0] if all(len(x) == 3 and x == lists[0] for x in lists) else None

        urls = wait_for(views, timeout=30, interval=0.2)
        # Membership is in the shared catalog: the spokes heartbeat through hub A (first in
        # their lists), and hub B lists them.
        with shared.b.rest(spoke_token) as c:
            listed = c.get(f"/api/v1/groups/{group}/members").json()["members"]
        assert sorted(m["url"] if isinstance(m, dict) else m for m in listed) == sorted(urls)

        # Three readers, one per spoke, the same dataset: it crosses the WAN once.
        first = random_dataset(a.plane(), 24, 9100, "scaled")
        before, before_b = _wan(members), _wan(members, 1)
        _read_all(members, first)
        wan = _wan(members) - before
        print(f"three readers, 24 MiB: WAN {wan / first.frames:.3f}x the dataset's compressed chunks")
        assert wan <= 1.05 * first.frames, (wan, first.frames)
        assert _wan(members, 1) - before_b < 0.05 * first.frames  # hub A served them: B only answered probes

        # Hub A killed mid-read: spokes and readers carry on through hub B, every byte correct.
        second = random_dataset(a.plane(), 24, 9200, "scaled")
        before, before_b = _wan(members), _wan(members, 1)
        early = threading.Event()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            reading = pool.submit(_read_all, members, second, early)
            assert early.wait(60)
            _kill(a)
            longest = reading.result(120)
        wan, via_b = _wan(members) - before, _wan(members, 1) - before_b
        print(f"hub A killed mid-read: longest file read {max(longest):.2f} s, WAN {wan / second.frames:.3f}x, "
              f"{via_b / second.frames:.2f} of it through hub B")
        assert wan <= 1.25 * second.frames, (wan, second.frames)
        assert 0.1 * second.frames < via_b < 0.95 * second.frames, "the reads did not move from hub A to hub B mid-way"
        # The group lives on through hub B: heartbeats land there, no member is dropped.
        time.sleep(7)  # more than three heartbeats
        assert all(len(m.spoke.stats()["group"]["members"]) == 3 for m in members)
        assert all(m.spoke.proc.poll() is None for m in members)


# -- prefetch fills the owners' caches -------------------------------------------------------------


def _cached(spoke: Spoke, cid: bytes) -> bool:
    h = cid.hex()
    return os.path.exists(os.path.join(spoke.cache, "chunks", h[:2], h))


def test_a_hinted_job_fills_the_owners_caches_not_its_own(shared: Shared, tmp_path) -> None:
    group = unique_name("hinted")
    hub = shared.b
    spoke_token = hub.plane(shared.creds.token).create_token(unique_name("hint-spoke"), roles={"*": "read"}, rights=["spoke"])["token"]
    data = random_dataset(hub.plane(), 8, 9300, "scaled")
    with contextlib.ExitStack() as stack:
        members: list[Member] = []
        for i in range(2):
            wan = stack.enter_context(WanProxy("127.0.0.1", _port(hub.url), handshake=False))
            spoke = stack.enter_context(start_spoke(
                wan.url_for(), tmp_path / f"spoke{i}", "256MiB", token=spoke_token, group=group,
                args=["--log-level", "warning"],
            ))
            members.append(Member(spoke, [wan]))
        one, two = members
        names = [member_url(m.spoke.url) for m in members]
        wait_for(lambda: all(len(m.spoke.stats()["group"]["members"]) == 2 for m in members) or None, timeout=30, interval=0.2)
        theirs = [cid for cid in data.ids if owner(cid, names) == names[1]]
        mine = [cid for cid in data.ids if cid not in theirs]
        assert theirs and mine

        job = "hinted-group"
        plane = HttpPlane(one.spoke.url, shared.creds.token, job=job)
        paths = sorted(data.files)
        plane.hint(data.repo, data.commit, paths)
        wait_for(lambda: all(_cached(two.spoke, c) for c in theirs) and all(_cached(one.spoke, c) for c in mine) or None, timeout=30)
        time.sleep(0.5)  # let any stray fetch land before looking for it
        assert not any(_cached(one.spoke, c) for c in theirs), "spoke 1 kept copies of spoke 2's chunks"
        assert not any(_cached(two.spoke, c) for c in mine)
        # The job's reads then fetch nothing over the WAN: spoke 2's chunks come over the LAN.
        # (Heartbeats and token checks go on meanwhile: a few hundred bytes.)
        def fetched() -> int:
            return sum(m.spoke.stats().get(f"upstream_bytes_received_{p}", 0) for m in members for p in ("demand", "prefetch"))

        before, chunks_before = _wan(members), fetched()
        assert chunks_before >= data.frames  # the prefetch fetched the dataset from the hub, once
        for path in paths:
            assert plane.read(data.repo, data.commit, path) == data.files[path]
        assert fetched() == chunks_before
        assert _wan(members) - before < 16 * 1024, "chunks crossed the WAN again"
        stats = one.spoke.stats()
        hint = stats["jobs"][job]["prefetch"]["hint"]
        total = sum(map(len, data.files.values()))
        assert hint["prefetched_bytes"] == hint["used_bytes"] == total, hint
        assert stats["jobs"][job]["prefetch_coverage"] == 1.0
        assert stats["group"]["peer_chunks"] >= 2 * len(theirs)  # once for the prefetch, once for the reads
        plane.close()
