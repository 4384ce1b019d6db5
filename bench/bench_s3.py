"""GET throughput of the S3 API: fabric's hub (and a warm spoke, when present) against moto's S3 server.

Same machine, same client, same objects. The client is 16 concurrent
connections (PROCS processes x THREADS threads, keep-alive ``http.client``)
each reading whole objects through presigned URLs, round-robin over the set;
the server verifies each presigned SigV4 signature (moto does not check
signatures). Also measured: fabric's own REST GET of the same large objects,
the figure the S3 path should come within 1.5x of.

    python bench/bench_s3.py                       # ~3 minutes on 2 cores
    python bench/bench_s3.py --quick               # smoke test
    python bench/bench_s3.py --json-out r.json --md-out r.md

Targets: ``hub-s3`` (fabric hub, S3 listener), ``hub-rest`` (fabric's REST GET),
``moto``, and ``spoke-s3`` and ``spoke-rest`` when ``fabric spoke`` exists (a spoke in
front of the same hub, warmed by one full read before measuring): warm reads at a spoke
should be at least as fast as the same reads at the hub (issue 18).
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from urllib.parse import urlsplit

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _common import FABRIC_SRC, fabric_env, machine, save_json, stop_process

# fabric (and tests/, testbed/) from the revision measured: the working tree, or run_all.sh --rev's snapshot.
sys.path.insert(0, FABRIC_SRC)
from fabric.api.s3.sigv4 import presign_url

KiB, MiB = 1024, 1024 * 1024


# -- load generator ------------------------------------------------------------------------
def _worker(host: str, port: int, reqs: list[tuple[str, dict]], stop_at: float, out: list) -> None:
    conn = http.client.HTTPConnection(host, port, timeout=120)
    n = nbytes = errors = 0
    i = 0
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    while time.monotonic() < stop_at:
        path, headers = reqs[i % len(reqs)]
        i += 1
        try:
            conn.request("GET", path, headers=headers)
            r = conn.getresponse()
            cut = False
            while True:
                k = r.readinto(view)
                if not k:
                    break
                if r.status == 200:
                    nbytes += k  # bytes count as they arrive, so large objects measure fairly
                if time.monotonic() >= stop_at:
                    cut = True
                    break
            if cut:
                conn.close()
                break
            if r.status != 200:
                errors += 1
            else:
                n += 1
        except (OSError, http.client.HTTPException):
            errors += 1
            conn.close()
            conn = http.client.HTTPConnection(host, port, timeout=120)
    conn.close()
    out.append((n, nbytes, errors))


def _proc(url: str, reqs: list[tuple[str, dict]], threads: int, start_at: float, duration: float, q) -> None:
    u = urlsplit(url)
    out: list = []
    while time.monotonic() < start_at:
        time.sleep(0.001)
    stop_at = start_at + duration
    ts = [
        threading.Thread(target=_worker, args=(u.hostname, u.port, reqs[k::threads] or reqs, stop_at, out))
        for k in range(threads)
    ]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    q.put([sum(x[i] for x in out) for i in range(3)])


def load(url: str, reqs: list[tuple[str, dict]], procs: int, threads: int, duration: float) -> dict:
    """Run ``procs*threads`` concurrent clients for ``duration`` seconds."""
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    start_at = time.monotonic() + 0.5
    ps = [ctx.Process(target=_proc, args=(url, reqs[k::procs] or reqs, threads, start_at, duration, q)) for k in range(procs)]
    for p in ps:
        p.start()
    results = [q.get(timeout=duration + 300) for _ in ps]
    for p in ps:
        p.join()
    n, nbytes, errors = (sum(r[i] for r in results) for i in range(3))
    return {"requests": n, "bytes": nbytes, "errors": errors, "seconds": duration,
            "req_per_s": n / duration, "mb_per_s": nbytes / duration / 1e6}


# -- servers -------------------------------------------------------------------------------
def _wait(url: str, timeout: float = 60.0, proc: subprocess.Popen | None = None, log: str = "") -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = open(log, errors="replace").read()[-3000:] if log else ""  # noqa: SIM115
            raise SystemExit(f"the server for {url} exited with code {proc.returncode}:\n{tail}")
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url} did not answer within {timeout:.0f}s")


def start_hub(work: str, python: str) -> tuple[subprocess.Popen, str, str, str]:
    from fabric.util.net import free_port

    port, s3port = free_port(), free_port()
    log = open(os.path.join(work, "hub.log"), "wb")  # noqa: SIM115 - the server writes it until stopped
    proc = subprocess.Popen(
        [python, "-m", "fabric.cli.main", "hub", "--data", os.path.join(work, "hub"), "--listen", f"127.0.0.1:{port}",
         "--s3-listen", f"127.0.0.1:{s3port}", "--log-level", "warning"],
        stdout=log, stderr=subprocess.STDOUT, env=fabric_env(), cwd=FABRIC_SRC,
    )
    url, s3 = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{s3port}"
    _wait(url + "/healthz", proc=proc, log=log.name)
    _wait(s3 + "/_fabric/healthz", proc=proc, log=log.name)
    token = open(os.path.join(work, "hub", "admin.token")).read().strip()  # noqa: SIM115
    return proc, url, s3, token


def start_spoke(
    work: str, python: str, hub_url: str, token: str, name: str = "spoke", port: int | None = None, args: Sequence[str] = ()
) -> tuple[subprocess.Popen, str, str] | None:
    """A spoke in front of the hub, per DESIGN.md section 6; None when this build has no spoke.
    ``name``: of its cache directory and log under ``work``; ``args``: more options."""
    from fabric.util.net import free_port

    probe = subprocess.run([python, "-m", "fabric.cli.main", "spoke", "--help"], capture_output=True, env=fabric_env(), cwd=FABRIC_SRC,
                           check=False)
    if probe.returncode != 0 or b"--s3-listen" not in probe.stdout:
        return None
    port, s3port = port or free_port(), free_port()
    log = open(os.path.join(work, f"{name}.log"), "wb")  # noqa: SIM115 - the server writes it until stopped
    proc = subprocess.Popen(
        [python, "-m", "fabric.cli.main", "spoke", "--hub", hub_url, "--cache", os.path.join(work, name),
         "--cache-size", "4GiB", "--listen", f"127.0.0.1:{port}", "--s3-listen", f"127.0.0.1:{s3port}", "--token", token, *args],
        stdout=log, stderr=subprocess.STDOUT, env=fabric_env(), cwd=FABRIC_SRC,
    )
    url, s3 = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{s3port}"
    _wait(url + "/healthz", proc=proc, log=log.name)
    _wait(s3 + "/_fabric/healthz", proc=proc, log=log.name)
    return proc, url, s3


# -- the benchmark -------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter runs, fewer objects")
    ap.add_argument("--duration", type=float, default=None, help="seconds per measurement (default 6, quick 2)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds per target (default 3, quick 1)")
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--work", default=os.path.join(HERE, "work", "stores"))
    ap.add_argument("--json-out")
    ap.add_argument("--md-out")
    args = ap.parse_args()
    duration = args.duration or (2.0 if args.quick else 6.0)
    rounds = args.rounds or (1 if args.quick else 3)
    n_small, n_large = (50, 2) if args.quick else (200, 8)
    concurrency = args.procs * args.threads

    import boto3
    from botocore.config import Config

    from tests.moto_server import start_moto

    os.makedirs(args.work, exist_ok=True)
    work = tempfile.mkdtemp(prefix="bench-s3-", dir=args.work)
    rnd = __import__("random").Random(7)
    small = {f"small/{i:04d}.bin": rnd.randbytes(100 * KiB) for i in range(n_small)}
    large = {f"large/{i:02d}.bin": rnd.randbytes(16 * MiB) for i in range(n_large)}
    has_httptools = subprocess.run([args.python, "-c", "import httptools"], env=fabric_env(), capture_output=True, check=False)
    results: dict = {"http_parser": "httptools" if has_httptools.returncode == 0 else "h11", "machine": machine(), "concurrency": concurrency, "duration": duration, "rounds": rounds,
                     "objects": {"small": [n_small, 100 * KiB], "large": [n_large, 16 * MiB]},
                     "command": " ".join([os.path.relpath(sys.argv[0], os.path.dirname(HERE)), *sys.argv[1:]]), "runs": {}}
    procs: list[subprocess.Popen] = []
    try:
        hub, hub_url, hub_s3, admin = start_hub(work, args.python)
        procs.append(hub)
        import httpx

        h = {"Authorization": f"Bearer {admin}"}
        tok = httpx.post(hub_url + "/api/v1/tokens", json={"name": "bench", "admin": True}, headers=h).json()
        ak, sk = tok["s3_access_key_id"], tok["s3_secret_access_key"]
        cfg = Config(s3={"addressing_style": "path"}, max_pool_connections=16)
        ours = boto3.client("s3", endpoint_url=hub_s3, aws_access_key_id=ak, aws_secret_access_key=sk,
                            region_name="us-east-1", config=cfg)
        ours.create_bucket(Bucket="bench")
        with start_moto() as moto_url:
            moto = boto3.client("s3", endpoint_url=moto_url, aws_access_key_id="testing", aws_secret_access_key="testing",
                                region_name="us-east-1", config=cfg)
            moto.create_bucket(Bucket="bench")
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(8) as pool:
                for c in (ours, moto):
                    list(pool.map(lambda kv, c=c: c.put_object(Bucket="bench", Key=kv[0], Body=kv[1]),
                                  list(small.items()) + list(large.items())))
            httpx.post(hub_url + "/api/v1/repos/bench/branches/main/commits", json={"message": "bench objects"}, headers=h,
                       timeout=120).raise_for_status()

            def s3_reqs(endpoint: str, key: str, secret: str, keys) -> list:
                out = []
                for k in keys:
                    u = urlsplit(presign_url("GET", endpoint, f"/bench/{k}", key, secret, expires=3600))
                    out.append((f"{u.path}?{u.query}", {}))
                return out

            targets = {
                "hub-s3": (hub_s3, ak, sk),
                "moto": (moto_url, "testing", "testing"),
            }
            try:
                spoke = start_spoke(work, args.python, hub_url, tok["token"])
            except SystemExit as exc:
                spoke = None
                results["spoke"] = "`fabric spoke --s3-listen` did not start: " + str(exc).strip().splitlines()[-1]
            if spoke is not None:
                procs.append(spoke[0])
                targets["spoke-s3"] = (spoke[2], ak, sk)
                # Warm: read everything once through the spoke.
                for path, hd in s3_reqs(spoke[2], ak, sk, list(small) + list(large)):
                    httpx.get(spoke[2] + path, headers=hd, timeout=120).raise_for_status()
            elif "spoke" not in results:
                results["spoke"] = "no `fabric spoke` with --s3-listen in this build: not measured"
            for size, keys in (("small", list(small)), ("large", list(large))):
                plans = {name: (url, s3_reqs(url, a, s, keys)) for name, (url, a, s) in targets.items()}
                rest = [(f"/api/v1/repos/bench/refs/main/objects?path={k}", {"Authorization": f"Bearer {tok['token']}"})
                        for k in keys]
                plans["hub-rest"] = (hub_url, rest)
                if spoke is not None:
                    plans["spoke-rest"] = (spoke[1], rest)
                # Verify every target serves the right bytes before timing.
                for name, (url, reqs) in plans.items():
                    path, hd = reqs[0]
                    body = httpx.get(url + path, headers=hd, timeout=120).content
                    want = (small if size == "small" else large)[keys[0]]
                    assert body == want, f"{name} served wrong bytes for {keys[0]}"
                runs: dict = {name: [] for name in plans}
                for r in range(rounds):
                    order = list(plans) if r % 2 == 0 else list(reversed(plans))
                    for name in order:
                        url, reqs = plans[name]
                        res = load(url, reqs, args.procs, args.threads, duration)
                        runs[name].append(res)
                        print(f"{size:5} {name:9} round {r + 1}: {res['req_per_s']:8.1f} req/s {res['mb_per_s']:8.1f} MB/s"
                              f" errors {res['errors']}", file=sys.stderr)
                results["runs"][size] = runs
    finally:
        for p in procs:
            stop_process(p)
        shutil.rmtree(work, ignore_errors=True)

    summary: dict = {}
    for size, runs in results["runs"].items():
        summary[size] = {name: {"req_per_s": statistics.median(r["req_per_s"] for r in rs),
                                "mb_per_s": statistics.median(r["mb_per_s"] for r in rs),
                                "errors": sum(r["errors"] for r in rs)} for name, rs in runs.items()}
    results["summary"] = summary
    md = render(results)
    print(md)
    if args.json_out:
        save_json(args.json_out, results)
    if args.md_out:
        with open(args.md_out, "w") as f:
            f.write(md)


def render(results: dict) -> str:
    s = results["summary"]
    lines = [
        (f"- {results['machine'].get('host_cpus')} CPUs ({results['machine'].get('cpu', '?')}), python "
        f"{results['machine'].get('python')}; fabric at {results['machine'].get('fabric_commit', '?')}"),
        f"- servers: fabric on uvicorn with the {results.get('http_parser', '?')} HTTP parser; moto's own (werkzeug)",
        (f"- {results['concurrency']} concurrent clients (keep-alive, presigned SigV4 GETs), {results['duration']:.0f} s per "
        f"measurement, median of {results['rounds']} round(s), targets alternating"),
        f"- objects: {results['objects']['small'][0]} x 100 KiB, {results['objects']['large'][0]} x 16 MiB (random bytes)",
        f"- command: `python {results['command']}`",
        "",
        "| objects | target | req/s | MB/s | errors |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for size in ("small", "large"):
        for name, v in s.get(size, {}).items():
            lines.append(f"| {size} | {name} | {v['req_per_s']:.1f} | {v['mb_per_s']:.1f} | {v['errors']} |")
    lines.append("")
    if "small" in s and "moto" in s["small"]:
        for name in ("hub-s3", "spoke-s3"):
            if name in s["small"]:
                lines.append(f"- small objects, {name} / moto: **{s['small'][name]['req_per_s'] / s['small']['moto']['req_per_s']:.1f}x** (goal >= 5x)")
    if "large" in s and "hub-rest" in s["large"]:
        for name in ("hub-s3", "spoke-s3"):
            if name in s["large"]:
                ratio = s["large"]["hub-rest"]["mb_per_s"] / s["large"][name]["mb_per_s"]
                lines.append(f"- large objects, hub REST / {name}: **{ratio:.2f}x** (goal <= 1.5x)")
        if "moto" in s["large"]:
            lines.append(f"- large objects, hub-s3 / moto: {s['large']['hub-s3']['mb_per_s'] / s['large']['moto']['mb_per_s']:.1f}x")
    for size, runs in results["runs"].items():
        for api in ("s3", "rest"):
            spoke, hub = runs.get(f"spoke-{api}"), runs.get(f"hub-{api}")
            if spoke and hub:
                ratios = ", ".join(f"{a['req_per_s'] / b['req_per_s']:.2f}x" for a, b in zip(spoke, hub))
                lines.append(f"- warm {size} objects, spoke-{api} / hub-{api}, round by round: {ratios} (goal >= 1.0x, issue 18)")
    if "spoke" in results:
        lines.append(f"- spoke: {results['spoke']}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
