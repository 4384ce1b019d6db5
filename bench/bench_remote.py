#!/usr/bin/env python3
"""Remote import (issue 3): ``fabric import`` to a hub over HTTP vs ``rsync`` to an rsync daemon.

Per round, with fresh stores, each tool pushes v1 and then v2 of the
``versions`` data set (bench/gen_dataset.py) to a server on loopback; the
bytes on the wire are counted by a :class:`testbed.wanproxy.WanProxy` between
the client and the server (the same counter for every tool: TCP payload both
ways, headers and protocol included), and each push is timed as a whole
process::

    fabric --server http://PROXY --token T -q --json import v1 bench@main -m v1
    fabric --server http://PROXY --token T -q --json import v2 bench@main -m v2
    rsync -a --delete --stats v1/ rsync://PROXY/dst/        # then v2/, same module
    rsync -a --delete --stats -z --zc=zstd v1/ rsync://PROXY/dst/   # then v2/ (compressed peer)

By default the proxy adds no delay and no rate cap (loopback, a pure byte
counter); ``--rtt-ms``/``--rate-mbit`` emulate a WAN instead. The hub's own
``fabric_http_bytes_total{direction="in"}`` (request bodies only) is recorded
as a cross-check of fabric's figure. The goal: fabric sends fewer bytes than
rsync for the v2 update.

    python bench/bench_remote.py                 # full size (1.25 GiB v1), 3 rounds
    python bench/bench_remote.py --quick         # 1/10 data set, 1 round (smoke test)

This module also holds the server helpers (hub, spoke, rsync daemon, moto,
proxy) that bench_spoke.py uses.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _common import (
    FABRIC_SRC,
    MB,
    Timed,
    fabric_cmd,
    fabric_env,
    loadavg,
    machine,
    median,
    remove,
    run,
    run_timed,
    save_report,
    stop_process,
    with_retries,
)

sys.path.insert(0, FABRIC_SRC)
from testbed.wanproxy import WanProxy

MiB = 1024 * 1024
WORK = os.path.join(HERE, "work")


# -- environment --------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen | None = None, log: str = "", timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"server on port {port} exited with code {proc.returncode}:\n{_tail(log)}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.1)
    raise SystemExit(f"nothing listens on port {port} after {timeout:.0f}s:\n{_tail(log)}")


def wait_http(url: str, proc: subprocess.Popen | None = None, log: str = "", timeout: float = 60.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"the server for {url} exited with code {proc.returncode}:\n{_tail(log)}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url, timeout=2.0).status_code < 500:
                return
        time.sleep(0.1)
    raise SystemExit(f"{url} did not answer within {timeout:.0f}s:\n{_tail(log)}")


def _tail(log: str) -> str:
    if not log:
        return ""
    with open(log, errors="replace") as f:
        return f.read()[-3000:]


def ensure_versions(python: str, quick: bool, seed: int) -> str:
    """The versions data set at run_all.sh's path (generated once, reused)."""
    out = os.path.join(WORK, "data", f"versions{'-quick' if quick else ''}-s{seed}")
    cmd = [python, os.path.join(HERE, "gen_dataset.py"), "versions", "--out", out, "--seed", str(seed)]
    subprocess.run(cmd + (["--quick"] if quick else []), check=True)
    return out


def load_manifest(dataset: str) -> dict:
    with open(os.path.join(dataset, "manifest.json")) as f:
        return json.load(f)


def warm_page_cache(*dirs: str) -> None:
    """Read the data sets once so that every tool reads them from memory."""
    for d in dirs:
        for dirpath, _, names in os.walk(d):
            for n in names:
                with open(os.path.join(dirpath, n), "rb", buffering=0) as f:
                    while f.read(1 << 20):
                        pass


# -- servers ------------------------------------------------------------------------------
class Hub:
    """``fabric hub --data DIR --listen 127.0.0.1:PORT`` (a process this benchmark owns).

    ``args``: more ``fabric hub`` options (e.g. ``--db``, ``--store``); ``s3``: also serve the
    S3 API (``--s3-listen``, its URL in ``self.s3``); ``env``: the hub's environment.
    """

    def __init__(self, python: str, data: str, args: Sequence[str] = (), env: dict[str, str] | None = None,
                 s3: bool = False) -> None:
        self.python, self.data = python, data
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = data.rstrip("/") + ".hub.log"
        extra = list(args)
        if s3:
            s3port = free_port()
            self.s3 = f"http://127.0.0.1:{s3port}"
            extra += ["--s3-listen", f"127.0.0.1:{s3port}"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                fabric_cmd(python) + ["hub", "--data", data, "--listen", f"127.0.0.1:{self.port}", "--log-level", "warning",
                                      *extra],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env or fabric_env(),
            )
        wait_http(self.url + "/healthz", self.proc, self.log)
        if s3:
            wait_http(self.s3 + "/_fabric/healthz", self.proc, self.log)
        with open(os.path.join(data, "admin.token")) as f:
            self.token = f.read().strip()

    def cli(self, *args: str, url: str | None = None) -> list[str]:
        return fabric_cmd(self.python) + ["--server", url or self.url, "--token", self.token, "-q", "--json", *args]

    def metrics(self) -> dict:
        """From the hub's /metrics: ``bytes_in`` (``fabric_http_bytes_total{direction="in"}``, request
        bodies) and ``requests`` per ``METHOD route`` (``fabric_http_requests_total``)."""
        import httpx

        text = httpx.get(self.url + "/metrics", timeout=10).text
        out: dict = {"bytes_in": 0, "requests": {}}
        for line in text.splitlines():
            if line.startswith("fabric_http_bytes_total{") and 'direction="in"' in line:
                out["bytes_in"] += int(float(line.rsplit(" ", 1)[1]))
            elif line.startswith("fabric_http_requests_total{"):
                labels = dict(re.findall(r'(\w+)="([^"]*)"', line.rsplit("}", 1)[0]))
                key = f"{labels.get('method')} {labels.get('route')}"
                out["requests"][key] = out["requests"].get(key, 0) + int(float(line.rsplit(" ", 1)[1]))
        return out

    def stop(self) -> None:
        stop_process(self.proc)


class Spoke:
    """``fabric spoke --hub URL --cache DIR --cache-size SIZE --listen ... --token T``.

    ``port``: listen there (one chosen beforehand, e.g. for ``--advertise``); ``args``: more
    ``fabric spoke`` options.
    """

    def __init__(self, python: str, hub_url: str, cache: str, cache_size: str, token: str, port: int | None = None,
                 args: Sequence[str] = ()) -> None:
        self.python, self.token = python, token
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = cache.rstrip("/") + ".spoke.log"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                fabric_cmd(python) + ["spoke", "--hub", hub_url, "--cache", cache, "--cache-size", cache_size,
                                      "--listen", f"127.0.0.1:{self.port}", "--token", token, "--log-level", "warning",
                                      *args],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=fabric_env(),
            )
        wait_http(self.url + "/healthz", self.proc, self.log)

    def cli(self, *args: str) -> list[str]:
        return fabric_cmd(self.python) + ["--server", self.url, "--token", self.token, "-q", "--json", *args]

    def stats(self, token: str | None = None) -> dict:
        """``GET /api/v1/stats`` with the spoke's token (or ``token``)."""
        import httpx

        r = httpx.get(self.url + "/api/v1/stats", headers={"Authorization": f"Bearer {token or self.token}"}, timeout=60)
        r.raise_for_status()
        return r.json()

    def head(self, repo: str, ref: str) -> str:
        import httpx

        r = httpx.get(f"{self.url}/api/v1/repos/{repo}/commits/{ref}", headers={"Authorization": f"Bearer {self.token}"}, timeout=60)
        r.raise_for_status()
        return r.json()["id"]

    def stop(self) -> None:
        stop_process(self.proc)


class RsyncDaemon:
    """``rsync --daemon --no-detach`` on loopback with modules ``{name: (path, read_only)}``."""

    def __init__(self, workdir: str, modules: dict[str, tuple[str, bool]]) -> None:
        os.makedirs(workdir, exist_ok=True)
        self.port = free_port()
        self.conf = os.path.join(workdir, "rsyncd.conf")
        self.log = os.path.join(workdir, "rsyncd.log")
        lines = [f"pid file = {workdir}/rsyncd.pid", "use chroot = no", f"log file = {self.log}", "max connections = 0"]
        if os.geteuid() == 0:
            lines += ["uid = 0", "gid = 0"]
        for name, (path, ro) in modules.items():
            lines += [f"[{name}]", f"    path = {path}", f"    read only = {'yes' if ro else 'no'}"]
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(workdir, "rsyncd.pid"))
        self.proc = subprocess.Popen(
            ["rsync", "--daemon", "--no-detach", f"--config={self.conf}", f"--port={self.port}", "--address=127.0.0.1"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_port(self.port, self.proc, self.log)

    def stop(self) -> None:
        stop_process(self.proc)


class Moto:
    """moto's S3 server (``python -m moto.server``) on loopback, dummy credentials."""

    def __init__(self, python: str, workdir: str) -> None:
        os.makedirs(workdir, exist_ok=True)
        self.log = os.path.join(workdir, "moto.log")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [python, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=rclone_env({}),
            )
        wait_http(self.url + "/moto-api/", self.proc, self.log)

    def stop(self) -> None:
        stop_process(self.proc)


def rclone_env(remotes: dict[str, str]) -> dict[str, str]:
    """Environment for rclone with one S3 remote per ``{name: endpoint}`` and no config file or real credentials."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RCLONE_"))}
    env.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "RCLONE_CONFIG": os.devnull})
    for name, endpoint in remotes.items():
        p = f"RCLONE_CONFIG_{name.upper()}_"
        env.update({p + "TYPE": "s3", p + "PROVIDER": "Other", p + "ENDPOINT": endpoint, p + "ACCESS_KEY_ID": "testing",
                    p + "SECRET_ACCESS_KEY": "testing", p + "REGION": "us-east-1", p + "FORCE_PATH_STYLE": "true"})
    return env


@contextlib.contextmanager
def wan(port: int, rtt_ms: float, rate_mbit: float | None) -> Iterator[WanProxy]:
    """A WanProxy in front of 127.0.0.1:port (runs in this process; counts every byte both ways)."""
    proxy = WanProxy("127.0.0.1", port, delay_ms_up=rtt_ms / 2, delay_ms_down=rtt_ms / 2, rate_mbit=rate_mbit).start()
    try:
        yield proxy
    finally:
        proxy.stop()


def proc_cpu(pid: int) -> float:
    """CPU seconds of a process and all its descendants, live, exited-but-unreaped or reaped.

    utime + stime + cutime + cstime of ``pid``, plus the same for each child
    still listed (a zombie keeps its figures until it is reaped, then they
    move into the parent's cutime/cstime): an rsync daemon's per-connection
    children are counted whether or not it has reaped them yet.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    total = sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    try:
        children: list[str] = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                children += f.read().split()
    except OSError:
        return total
    return total + sum(proc_cpu(int(c)) for c in children)


def wire(before: dict, after: dict) -> dict:
    up, down = after["bytes_up"] - before["bytes_up"], after["bytes_down"] - before["bytes_down"]
    return {"up": up, "down": down, "total": up + down, "connections": after["connections"] - before["connections"]}


def rsync_stats(out: str) -> dict:
    """The figures of ``rsync --stats`` that matter here."""
    keys = {"Total bytes sent": "sent", "Total bytes received": "received", "Literal data": "literal",
            "Matched data": "matched", "Number of regular files transferred": "files_transferred"}
    got = {}
    for line in out.splitlines():
        for k, name in keys.items():
            if line.startswith(k + ":"):
                got[name] = int(re.sub(r"[^0-9]", "", line.split(":", 1)[1].split("B")[0]) or 0)
    return got


def timed_phase(cmd: list[str], proxy: WanProxy, env: dict | None = None, cwd: str | None = None,
                servers: tuple[int, ...] = ()) -> tuple[Timed, dict]:
    """Run ``cmd`` timed; the bytes it moved through ``proxy`` and the CPU the ``servers`` (PIDs)
    spent meanwhile: in all (``server_cpu``) and each (``server_cpu_each``, in their order)."""
    c0 = [proc_cpu(pid) for pid in servers]
    s0 = proxy.stats()
    t = run_timed(cmd, env=env, cwd=cwd)
    w = wire(s0, proxy.stats())
    w["server_cpu_each"] = [proc_cpu(pid) - before for pid, before in zip(servers, c0)]
    w["server_cpu"] = sum(w["server_cpu_each"])
    return t, w


# -- the benchmark ------------------------------------------------------------------------
def fabric_round(a: argparse.Namespace, data: str, r: int) -> dict:
    v1, v2 = os.path.join(data, "v1"), os.path.join(data, "v2")
    base = os.path.join(a.work, f"remote-fabric-{r}")
    remove(base)
    os.makedirs(base)
    hub = Hub(a.python, os.path.join(base, "hub"))
    try:
        run(hub.cli("repo", "create", "bench"), env=fabric_env())
        out: dict = {"tool": "fabric"}
        with wan(hub.port, a.rtt_ms, a.rate_mbit) as proxy:
            url = proxy.url_for()
            for ver, src in (("v1", v1), ("v2", v2)):
                m0 = hub.metrics()
                t, w = timed_phase(hub.cli("import", src, "bench@main", "-m", ver, url=url), proxy, env=fabric_env(),
                                   servers=(hub.proc.pid,))
                m1 = hub.metrics()
                requests = {k: n - m0["requests"].get(k, 0) for k, n in m1["requests"].items() if n - m0["requests"].get(k, 0)}
                out[ver] = {"wall": t.wall, "cpu": t.cpu, "maxrss_kib": t.maxrss_kib, "wire": w,
                            "hub_body_bytes_in": m1["bytes_in"] - m0["bytes_in"], "hub_requests": requests,
                            "result": json.loads(t.stdout), "cmd": shlex.join(t.cmd)}
        return out
    finally:
        hub.stop()
        remove(base)


def rsync_round(a: argparse.Namespace, data: str, r: int, compress: bool) -> dict:
    v1, v2 = os.path.join(data, "v1"), os.path.join(data, "v2")
    name = "rsync-z" if compress else "rsync"
    base = os.path.join(a.work, f"remote-{name}-{r}")
    remove(base)
    dst = os.path.join(base, "dst")
    os.makedirs(dst)
    daemon = RsyncDaemon(os.path.join(base, "daemon"), {"dst": (dst, False)})
    flags = ["-a", "--delete", "--stats"] + (["-z", "--zc=zstd"] if compress else [])
    try:
        out: dict = {"tool": name}
        with wan(daemon.port, a.rtt_ms, a.rate_mbit) as proxy:
            for ver, src in (("v1", v1), ("v2", v2)):
                cmd = ["rsync", *flags, src + "/", f"rsync://127.0.0.1:{proxy.port}/dst/"]
                t, w = timed_phase(cmd, proxy, servers=(daemon.proc.pid,))
                out[ver] = {"wall": t.wall, "cpu": t.cpu, "maxrss_kib": t.maxrss_kib, "wire": w,
                            "rsync_stats": rsync_stats(t.stdout), "cmd": shlex.join(cmd)}
        return out
    finally:
        daemon.stop()
        remove(base)


def run_rounds(a: argparse.Namespace, data: str) -> list[dict]:
    tools = ["fabric", "rsync"] + (["rsync-z"] if a.rsync_z else [])
    rounds = []
    for r in range(a.warmup + a.runs):
        order = tools if r % 2 == 0 else tools[::-1]
        got = {"round": r, "warmup": r < a.warmup, "load_before": loadavg(), "order": order}
        for tool in order:
            if tool == "fabric":
                got[tool] = with_retries(fabric_round, a, data, r)
            else:
                got[tool] = with_retries(rsync_round, a, data, r, tool == "rsync-z")
            print(f"round {r} {tool}: " + ", ".join(
                f"{v} {got[tool][v]['wire']['total'] / MiB:.1f} MiB in {got[tool][v]['wall']:.1f}s" for v in ("v1", "v2")),
                file=sys.stderr, flush=True)
        got["load_after"] = loadavg()
        rounds.append(got)
    return rounds


def summarize(rounds: list[dict], manifest: dict) -> dict:
    counted = [r for r in rounds if not r["warmup"]]
    tools = [t for t in ("fabric", "rsync", "rsync-z") if t in counted[0]]
    size = {"v1": manifest["v1"]["bytes"], "v2": manifest["v2"]["bytes"]}
    s: dict = {}
    for t in tools:
        s[t] = {}
        for v in ("v1", "v2"):
            rows = [r[t][v] for r in counted]
            s[t][v] = {
                "wire_total": median([x["wire"]["total"] for x in rows]),
                "wire_up": median([x["wire"]["up"] for x in rows]),
                "wire_down": median([x["wire"]["down"] for x in rows]),
                "wire_min": min(x["wire"]["total"] for x in rows),
                "wire_max": max(x["wire"]["total"] for x in rows),
                "wall": median([x["wall"] for x in rows]),
                "wall_min": min(x["wall"] for x in rows),
                "wall_max": max(x["wall"] for x in rows),
                "cpu": median([x["cpu"] for x in rows]),
                "server_cpu": median([x["wire"]["server_cpu"] for x in rows]),
                "mb_per_s": median([size[v] / x["wall"] / MB for x in rows]),
            }
            if t == "fabric":
                s[t][v]["hub_body_bytes_in"] = median([x["hub_body_bytes_in"] for x in rows])
                s[t][v]["hub_requests"] = {k: median([x["hub_requests"].get(k, 0) for x in rows]) for k in rows[0]["hub_requests"]}
    # ratios taken round by round, then the median
    for peer in tools[1:]:
        s[f"fabric/{peer}"] = {
            v: {"bytes": median([r["fabric"][v]["wire"]["total"] / r[peer][v]["wire"]["total"] for r in counted]),
                "throughput": median([r[peer][v]["wall"] / r["fabric"][v]["wall"] for r in counted])}
            for v in ("v1", "v2")
        }
    return s


def render(results: dict) -> str:
    s, m, a = results["summary"], results["manifest"], results["args"]
    lines = [
        (f"- date: {results['machine']['date']}; machine: {results['machine'].get('host_cpus')} CPUs "
        f"({results['machine'].get('cpu', '?')}), {results['machine'].get('mem_gib', '?')} GiB; fabric {results['machine']['fabric_commit']}"),
        "- load average (1/5/15 min) per round, before -> after: "
        + "; ".join(f"{r['load_before']} -> {r['load_after']}" for r in results["rounds"]),
        (f"- data: v1 = {m['v1']['files']} files, {m['v1']['bytes'] / MiB:.0f} MiB; v2 = {m['v2']['files']} files, "
        f"{m['v2']['bytes'] / MiB:.0f} MiB ({len(m['edited'])} edited by {m['params']['edit_size']} B, "
        f"{m['params']['new']} new, {len(m['renamed'])} renamed, {len(m['duplicated'])} duplicated)"),
        (f"- link: WanProxy client -> server, RTT {a['rtt_ms']:g} ms, rate {a['rate_mbit'] or 'uncapped'}"
        f"{' Mbit/s' if a['rate_mbit'] else ''}; bytes = TCP payload both ways at the proxy"),
        f"- {a['runs']} counted round(s) (+{a['warmup']} warm-up), fresh server store per round; medians (min..max)",
        f"- command: `{results['command']}`",
        "",
        "| tool | phase | wire MiB (up / down) | wall s | MB/s | client CPU s | server CPU s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for t in ("fabric", "rsync", "rsync-z"):
        if t not in s:
            continue
        for v in ("v1", "v2"):
            x = s[t][v]
            lines.append(
                f"| {t} | {v} | {x['wire_total'] / MiB:.2f} ({x['wire_up'] / MiB:.2f} / {x['wire_down'] / MiB:.2f}) | "
                f"{x['wall']:.2f} ({x['wall_min']:.2f}..{x['wall_max']:.2f}) | {x['mb_per_s']:.0f} | {x['cpu']:.2f} | "
                f"{x['server_cpu']:.2f} |"
            )
    lines.append("")
    f = s["fabric"]
    lines.append(f"- hub's own count of request bodies received (`fabric_http_bytes_total{{direction=\"in\"}}`): "
                 f"v1 {f['v1']['hub_body_bytes_in'] / MiB:.2f} MiB, v2 {f['v2']['hub_body_bytes_in'] / MiB:.2f} MiB")
    for v in ("v1", "v2"):
        reqs = ", ".join(f"{k} x{n:.0f}" for k, n in sorted(f[v]["hub_requests"].items(), key=lambda kv: -kv[1]) if "metrics" not in k)
        lines.append(f"- requests the hub served for the {v} import: {reqs}")
    for peer in ("rsync", "rsync-z"):
        key = f"fabric/{peer}"
        if key in s:
            r = s[key]
            lines.append(
                f"- fabric / {peer}: v2 bytes **{r['v2']['bytes']:.2f}x** (goal < 1.0: "
                f"{'met' if r['v2']['bytes'] < 1.0 else 'MISSED'}), v1 bytes {r['v1']['bytes']:.2f}x; "
                f"throughput v1 {r['v1']['throughput']:.2f}x, v2 {r['v2']['throughput']:.2f}x (>1: fabric faster)"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", help="versions data set (default: generated under bench/work/data/)")
    p.add_argument("--quick", action="store_true", help="1/10 data set, 1 round (smoke test)")
    p.add_argument("--runs", type=int, default=None, help="counted rounds (default 3, quick 1)")
    p.add_argument("--warmup", type=int, default=0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--work", default=os.path.join(WORK, "stores"))
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--rtt-ms", type=float, default=0.0, help="emulated RTT between client and server (default 0: loopback)")
    p.add_argument("--rate-mbit", type=float, default=None, help="emulated link rate (default: uncapped)")
    p.add_argument("--no-rsync-z", dest="rsync_z", action="store_false", help="skip the compressed rsync peer")
    p.add_argument("--json-out")
    p.add_argument("--md-out")
    a = p.parse_args(argv)
    if a.runs is None:
        a.runs = 1 if a.quick else 3
    for tool in ("rsync",):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is not on PATH")
    os.makedirs(a.work, exist_ok=True)
    data = a.dataset or ensure_versions(a.python, a.quick, a.seed)
    manifest = load_manifest(data)
    warm_page_cache(os.path.join(data, "v1"), os.path.join(data, "v2"))
    info = machine()
    info["rsync"] = run(["rsync", "--version"]).splitlines()[0]
    rounds = run_rounds(a, data)
    results = {
        "machine": info, "args": vars(a), "manifest": {k: manifest[k] for k in ("params", "v1", "v2", "edited", "renamed", "duplicated")},
        "rounds": rounds, "summary": summarize(rounds, manifest),
        "command": shlex.join(["python", "bench/bench_remote.py", *(argv if argv is not None else sys.argv[1:])]),
    }
    md = render(results)
    save_report(md, results, a.json_out, a.md_out)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
