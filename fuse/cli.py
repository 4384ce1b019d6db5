"""``fabric mount`` and ``fabric umount``."""

from __future__ import annotations

import os
import re
import sys

import click

from fabric.cli.context import Ctx, handle_errors, human_size, pass_ctx
from fabric.engine.refs import split_repo_ref
from fabric.errors import BadRequest
from fabric.plane.jobs import JOB_ENV

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def parse_size(text: str) -> int:
    """``512M``, ``10GiB``, ``4096`` -> bytes (binary units)."""
    m = _SIZE.match(str(text))
    if not m:
        raise click.BadParameter(f"{text!r} is not a size (e.g. 512M, 10G, 4096)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


class Size(click.ParamType):
    name = "SIZE"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except click.BadParameter as exc:
            self.fail(str(exc), param, ctx)


MOUNT_HELP = """Mount REPO@REF from the hub or spoke at SERVER_URL on MOUNTPOINT.

\b
  fabric mount http://spoke:8700 datasets@v1 /mnt/imagenet          # a tag: immutable
  fabric mount http://spoke:8700 ckpt@run-42 /mnt/ckpt --rw          # a writable branch
  fabric mount http://spoke-a:8700,http://spoke-b:8700,http://hub:8600 datasets@v1 /mnt/d
  fabric umount /mnt/ckpt

SERVER_URL may be a comma-separated list, nearest first (the spokes of the
region, then the hub): the mount uses the nearest healthy one and moves to
the next when it fails, in the middle of a read too, without an error.

A commit or tag is immutable: the kernel keeps its page and attribute
caches, so a second epoch is served from memory. A branch follows its head
with close-to-open coherence (each open/ls sees every change completed
before it); it is read-only unless --rw.

With --passthrough (a commit or tag with --cache-dir, as root, on Linux
6.9+), each file of 1 MiB or more read whole through the mount is also
kept as a plain copy in --cache-dir, and later opens of it hand the kernel
that copy: it is read at the local disk's speed, never through the mount
(no copy is served whose bytes were last read whole and checked more than
a day before: a copy is checked as it is made, by a scrub in the background
from the mount's start, most recently used first, as checks go stale, or at
its first open if that comes sooner; the time of each check is kept with the
copy, so a restarted mount serves copies checked within the day at once;
--no-passthrough-check trusts a file system that checks its data itself).
Such a mount is served without libfuse, and every open asks it (more CPU
for many small files).

With --rw, writes land in local files (--write-dir) and are staged on the
branch when a file is closed or fsynced, and when it is renamed; other
changes (mkdir, rm, mv, chmod, chown, touch, ln -s) are staged at once.
Staged changes become a commit with `fabric commit REPO@BRANCH -m MSG`, or
by --commit-interval / --commit-on-unmount. fsync returns once the data is
durable at --durability: with `local` (mounting a spoke) once the spoke has
it on disk, even while the hub is away, and the spoke pushes it to the hub
in the background; with `hub` once the hub has stored it. Mounting a hub,
both mean the hub. A file written in order from empty (a checkpoint shard)
is chunked and sent while it is written, so its fsync waits only for the
last few MiB and the durability round trip. With --writeback, fsync and
close return once the file is on this machine's disk (--write-dir) and the
mount stages it in the background: a checkpoint then stalls training about
twice as long as a local write and fsync would, not ten times. With
--writeback and --durability replicated (mounting a spoke in a group),
fsync also returns only once a peer spoke of the group keeps the file on
its disk; that peer stages it if this machine is lost.

With --commit-checkpoints, a torch Distributed Checkpoint saved through the
mount becomes a commit of its own once DCP renames its DIR/.metadata into
place (the save's last step), in the background: a save into step-N at the
branch's root is also tagged BRANCH.step-N, so `fabric checkpoints`
and fabric.checkpoint's latest() and load() find it, and never a save that
died before its end:

\b
  fabric branch create models ckpt.run1 --from main
  fabric mount SPOKE models@ckpt.run1 /mnt/ckpt --rw --commit-checkpoints
  # training: dcp.save(state, checkpoint_id="/mnt/ckpt/step-900")
  fabric checkpoints models --run run1

--seed-copies DIR also keeps each file staged as a plain copy in DIR, so
that a --passthrough mount of the commit with --cache-dir DIR restores it
on this machine at the local disk's speed:

\b
  fabric mount SPOKE ckpt@run-42 /mnt/ckpt --rw --writeback \\
      --write-dir /var/fabric/writes --seed-copies /var/fabric/copies
  fabric mount SPOKE ckpt@step-900 /mnt/restore --passthrough \\
      --cache-dir /var/fabric/copies

The mount outlives its server: while the server restarts (or every server
of a list is away), requests wait and resume; after --server-timeout
seconds without it they fail with EIO, and work again once it is back.
Only 5 requests at a time wait for a server that is away (the others
would hold every mount thread): further requests that need the server
fail with EIO at once, and what needs no server is answered meanwhile.

\b
Errors for what the mount does not do:
  EROFS         writing to a commit, a tag, or a branch mounted without --rw
  EPERM         a hard link to a directory; mknod of a device without root
  EOPNOTSUPP    extended attributes; fallocate modes other than allocation
  EINVAL        rename with RENAME_EXCHANGE / RENAME_WHITEOUT
  EILSEQ        file names that are not valid UTF-8
  ENAMETOOLONG  names over 255 bytes, paths over 4096 bytes
  EIO           server away for longer than --server-timeout (or away while
                5 requests already wait for it)
  ENOSPC        the spoke has had no room for writes not yet at the hub for
                its --full-wait (a write first waits while the spoke pushes
                earlier ones to the hub: back-pressure, not failure)

Starts the mount in the background and returns once it is ready
(--foreground stays attached). The log, with per-operation latency
statistics, is at --log-file.
"""


@click.command("mount", help=MOUNT_HELP)
@click.argument("server_url", metavar="SERVER_URL")
@click.argument("target", metavar="REPO@REF")
@click.argument("mountpoint", type=click.Path(file_okay=False))
@click.option("--rw", is_flag=True, help="Writable mount (REF must be a branch): changes are staged on the branch.")
@click.option("--token", envvar="FABRIC_TOKEN", metavar="TOKEN", help="API token. Env: FABRIC_TOKEN.")
@click.option("--foreground", "-f", is_flag=True, help="Serve in this process until unmounted (logs to stderr unless --log-file).")
@click.option("--allow-other", is_flag=True, help="Let other users use the mount (permission bits still apply; non-root users need user_allow_other in /etc/fuse.conf).")
@click.option("--durability", type=click.Choice(["local", "replicated", "hub"]), default="local", show_default=True, help="When fsync and close return: local = stored on the server mounted (the spoke's disk); replicated = on the spoke's disk and on one other spoke's of its group (losing one spoke machine loses nothing); hub = stored at the hub.")
@click.option("--writeback", is_flag=True, help="With --rw: fsync and close return once the file is on this machine's disk (--write-dir, required), and the mount chunks and stages it on the branch in the background after its close, or once a file kept open has not been written for 5 s (at --durability). A mount killed before that takes it over when started again with the same --write-dir (it serves at once and stages it in the background), or `fabric mount-flush SERVER_URL WRITE_DIR` stages it without mounting; losing that disk loses it, except at --durability replicated: fsync then also waits for a peer spoke of the mounted spoke's group to keep the file, and that peer stages it once this mount has been silent for its --replica-takeover.")
@click.option("--writeback-backlog", type=Size(), default="4G", show_default=True, help="With --writeback: at most this many bytes wait for staging; a fsync or close beyond it stages its file before returning (back-pressure).")
@click.option("--no-stream-writes", is_flag=True, help="Chunk and send a file only when it is fsynced or closed (default: a file written in order from empty is chunked and sent while it is written, so fsync costs only its tail).")
@click.option("--commit-interval", type=float, default=0, metavar="SECONDS", show_default=True, help="With --rw, commit staged changes every SECONDS (0: never; use `fabric commit`).")
@click.option("--commit-on-unmount", is_flag=True, help="With --rw, commit staged changes when unmounted.")
@click.option("--commit-message", default="fabric mount", show_default=True, help="Message of the mount's own commits.")
@click.option("--commit-checkpoints", is_flag=True, help="With --rw: when a torch Distributed Checkpoint save through the mount renames its DIR/.metadata into place (its last step), stage DIR's files, commit the branch (step and format in the commit's metadata) and, for step-N at the branch's root, tag the commit BRANCH.step-N, as fabric.checkpoint does (`fabric checkpoints` lists it). In the background: the save does not wait.")
@click.option("--server-timeout", type=float, default=120.0, metavar="SECONDS", show_default=True, help="How long requests wait for an unreachable server before failing with EIO.")
@click.option("--attr-timeout", type=float, default=1.0, metavar="SECONDS", show_default=True, help="Branch mounts: how long the kernel may cache names and attributes (opens and listings always check).")
@click.option("--readahead", type=Size(), default="32M", show_default=True, help="Sequential readahead window per open file (also the kernel's, when run as root).")
@click.option("--memory-cache", type=Size(), default="512M", show_default=True, help="Chunks kept in memory.")
@click.option("--cache-dir", type=click.Path(file_okay=False), help="Also keep chunks on disk here, appended to packs of up to 64 MiB (survives remounts; chunk files of older versions there are removed).")
@click.option("--cache-size", type=Size(), default="10G", show_default=True, help="Size bound of --cache-dir.")
@click.option("--passthrough", is_flag=True, help="A commit or tag with --cache-dir, as root: keep a plain copy of each file of 1 MiB or more read whole through the mount in --cache-dir, or --copies-dir (half of --cache-size), and let the kernel read those copies itself (FUSE passthrough, Linux 6.9+): a second read after the page cache is gone runs at the local disk's speed. Served without libfuse; every open then asks the mount (more CPU for many small files). Without passthrough in the kernel, files are read as usual.")
@click.option("--copies-dir", type=click.Path(file_okay=False), metavar="DIR", help="With --passthrough: keep the plain copies in DIR instead of --cache-dir. Several processes may share DIR (a node's copies): writable mounts leave theirs there with --seed-copies DIR, fabric:// with copies=DIR, and other passthrough mounts read them. Its size bound is this mount's half of --cache-size.")
@click.option("--no-passthrough-check", is_flag=True, help="With --passthrough: trust the copies at rest instead of reading each one whole and checking it again before it is served when its last check is more than a day old (in the background, or at its first open if that comes sooner). Only where the file system under --cache-dir checks its data itself (ZFS, btrfs): a copy damaged on a plain disk would then be served.")
@click.option("--seed-copies", type=click.Path(file_okay=False), metavar="DIR", help="With --rw: once a file of 1 MiB or more written here is staged, keep a plain copy of it in DIR (a hard link to the mount's own file where DIR is on the --write-dir's file system). A `--passthrough` mount of a commit or tag with `--copies-dir DIR` (or `--cache-dir DIR`) then reads those files as local files: a checkpoint restored on the machine that saved it reads at the local disk's speed. Not this mount's own --cache-dir.")
@click.option("--seed-copies-size", type=Size(), default="5G", show_default=True, help="Size bound of the copies in --seed-copies (the least recently opened go first).")
@click.option("--spoke-cache", type=click.Path(file_okay=False), help="The --cache directory of the spoke SERVER_URL names, when it runs on this machine: chunks it holds are read from its files, each checked against its id, instead of over HTTP (about half the CPU of a warm read). Read-only; chunks it lacks still come from the spoke.")
@click.option("--write-dir", type=click.Path(file_okay=False), help="Where files being written are kept until staged (default: a new temporary directory).")
@click.option("--bwlimit", metavar="RATE|UP:DOWN", help="Move at most RATE bytes a second each way with SERVER_URL (K, M, G: binary units; e.g. 100M), or UP:DOWN ('off' for no cap one way).")
@click.option("--uid", type=int, default=None, help="Owner shown for entries that record none (default: the mounting user).")
@click.option("--gid", type=int, default=None, help="Group shown for entries that record none (default: the mounting user's group).")
@click.option("-o", "options", multiple=True, metavar="OPT[=VAL]", help="Extra FUSE mount option (repeatable), e.g. -o max_read=1048576.")
@click.option("--log-file", type=click.Path(dir_okay=False), help="Log here (default in the background: ~/.cache/fabric/mounts/<id>.log).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info", show_default=True)
@click.option("--stats-interval", type=float, default=60.0, show_default=True, metavar="SECONDS", help="Log per-operation latency statistics this often (0: only at unmount).")
@click.option("--ready-fd", type=int, hidden=True)
@handle_errors
def mount(
    server_url: str,
    target: str,
    mountpoint: str,
    rw: bool,
    token: str | None,
    foreground: bool,
    allow_other: bool,
    durability: str,
    writeback: bool,
    writeback_backlog: int,
    no_stream_writes: bool,
    commit_interval: float,
    commit_on_unmount: bool,
    commit_message: str,
    commit_checkpoints: bool,
    server_timeout: float,
    attr_timeout: float,
    readahead: int,
    memory_cache: int,
    cache_dir: str | None,
    cache_size: int,
    passthrough: bool,
    copies_dir: str | None,
    no_passthrough_check: bool,
    seed_copies: str | None,
    seed_copies_size: int,
    spoke_cache: str | None,
    write_dir: str | None,
    bwlimit: str | None,
    uid: int | None,
    gid: int | None,
    options: tuple[str, ...],
    log_file: str | None,
    log_level: str,
    stats_interval: float,
    ready_fd: int | None,
) -> None:
    from fabric.client.spoke_files import SpokeFiles
    from fuse.config import MountConfig
    from fuse.mount import (
        check_mountpoint,
        check_passthrough,
        check_write_dirs,
        default_log_path,
        open_plane,
        resolve_target,
        run_foreground,
        setup_logging,
        spawn,
    )

    repo, ref = split_repo_ref(target)
    if ref is None:
        raise BadRequest(f"give a ref: {target!r} should be REPO@REF, e.g. {target}@main")
    if (commit_interval or commit_on_unmount or commit_checkpoints) and not rw:
        raise click.UsageError("--commit-interval, --commit-on-unmount and --commit-checkpoints need --rw")
    if writeback and not rw:
        raise click.UsageError("--writeback needs --rw")
    if writeback and not write_dir:
        raise click.UsageError("--writeback needs --write-dir: the directory where files wait to be staged must outlive the mount")
    fuse_options: dict = {}
    for o in options:
        key, eq, value = o.partition("=")
        fuse_options[key] = value if eq else True
    if bwlimit:
        from fabric.client.bandwidth import parse_bwlimit

        parse_bwlimit(bwlimit)  # refused here, before anything is mounted
    if not foreground:
        # Fail fast, in this terminal, on what can be checked here.
        check_mountpoint(mountpoint)
        if spoke_cache:
            try:
                SpokeFiles(spoke_cache)
            except BadRequest as exc:
                raise BadRequest(f"--spoke-cache: {exc}") from None
        is_branch = resolve_target(open_plane(server_url, token, durability, bwlimit), repo, ref, rw)[0]
        check_passthrough(MountConfig(repo, ref, cache_dir=cache_dir, passthrough=passthrough, copies_dir=copies_dir,
                                      check_copies=not no_passthrough_check), is_branch, fuse_options)
        check_write_dirs(MountConfig(repo, ref, writable=rw, cache_dir=cache_dir, write_dir=write_dir, seed_copies=seed_copies))
        log_path = log_file or default_log_path(mountpoint)
        argv = [sys.executable, "-m", "fabric.cli.main", "mount", server_url, target, os.path.abspath(mountpoint)]
        argv += [*_child_options(click.get_current_context()), "--foreground", "--log-file", log_path]
        if token:
            os.environ["FABRIC_TOKEN"] = token  # the child reads it from its environment, never its argv
        pid = spawn(argv, mountpoint, log_path)
        click.echo(f"mounted {repo}@{ref} at {os.path.realpath(mountpoint)} (pid {pid}, log {log_path})", err=True)
        return
    setup_logging(log_file, log_level)
    cfg = MountConfig(
        repo=repo,
        ref=ref,
        writable=rw,
        uid=os.getuid() if uid is None else uid,
        gid=os.getgid() if gid is None else gid,
        attr_timeout=attr_timeout,
        server_timeout=server_timeout,
        readahead=readahead,
        memory_cache=memory_cache,
        cache_dir=cache_dir,
        cache_size=cache_size,
        passthrough=passthrough,
        copies_dir=copies_dir,
        check_copies=not no_passthrough_check,
        seed_copies=seed_copies,
        seed_copies_size=seed_copies_size,
        spoke_cache=spoke_cache,
        write_dir=write_dir,
        commit_interval=commit_interval,
        commit_on_unmount=commit_on_unmount,
        commit_message=commit_message,
        commit_checkpoints=commit_checkpoints,
        durability=durability,
        writeback=writeback,
        writeback_backlog=writeback_backlog,
        stream_writes=not (no_stream_writes or writeback),  # (--writeback chunks after the close: fuse/writeback.py)
        job=os.environ.get(JOB_ENV) or None,
        bwlimit=bwlimit,
    )
    run_foreground(server_url, token, cfg, mountpoint, allow_other, fuse_options, ready_fd, stats_interval)


_NOT_PASSED = {"server_url", "target", "mountpoint", "token", "foreground", "log_file", "ready_fd"}


def _child_options(ctx: click.Context) -> list[str]:
    """This invocation's options, for the background mount process."""
    out: list[str] = []
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or param.name in _NOT_PASSED or param.name not in ctx.params:
            continue
        value = ctx.params[param.name]
        flag = max(param.opts, key=len)
        if param.is_flag:
            if value:
                out.append(flag)
        elif param.multiple:
            for v in value:
                out += [flag, str(v)]
        elif value is not None:
            out += [flag, str(value)]
    return out


@click.command("umount")
@click.argument("mountpoint", type=click.Path(file_okay=False))
@click.option("--lazy", "-z", is_flag=True, help="Detach now even if files are open; the mount goes away when they are closed.")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="How long to wait for the mount process to finish (flushing, committing).")
@handle_errors
def umount(mountpoint: str, lazy: bool, timeout: float) -> None:
    """Unmount a fabric mount and wait until its process has finished (staged writes, unmount commit)."""
    from fuse.mount import unmount

    unmount(mountpoint, lazy, timeout)


@click.command("mount-flush")
@click.argument("server_url", metavar="SERVER_URL")
@click.argument("write_dir", type=click.Path(file_okay=False))
@click.option("--token", envvar="FABRIC_TOKEN", metavar="TOKEN", help="API token. Env: FABRIC_TOKEN.")
@click.option("--durability", type=click.Choice(["local", "replicated", "hub"]), default="local", show_default=True, help="When a file counts as staged, as for `fabric mount --durability`.")
@click.option("--commit-message", default=None, metavar="TEXT", help="Then commit each branch a file was staged on, with this message (default: leave the files staged, as a mount without --commit-on-unmount does).")
@pass_ctx
@handle_errors
def mount_flush(ctx: Ctx, server_url: str, write_dir: str, token: str | None, durability: str, commit_message: str | None) -> None:
    """Stage the files a killed --writeback mount parked in WRITE_DIR, without mounting.

    Each file goes to the repository, branch and path it was written to, with its mode,
    owner, times and metadata; of two versions of a path the later wins. A file is
    dropped from WRITE_DIR only once staged; one that cannot be (its branch is gone, the
    server is away) stays for a later flush or for the next `fabric mount --writeback
    --write-dir WRITE_DIR`, and the command exits with status 1. Refused while a mount
    uses WRITE_DIR.
    """
    from fuse.flush import flush_journal
    from fuse.mount import open_plane

    plane = open_plane(server_url, token, durability)
    try:
        report = flush_journal(write_dir, plane, durability, commit_message, ctx.progress())
    finally:
        plane.close()
    lines = [f"staged {len(report.staged)} file(s), {human_size(report.staged_bytes)}, from {write_dir}"
             + (f" ({report.superseded} older version(s) dropped)" if report.superseded else "")]
    lines += [f"committed {where}: {cid[:12]}" for where, cid in report.committed.items()]
    ctx.emit(report.to_json(), "\n".join(lines))
    for name, why in report.failed.items():
        click.echo(f"error: not staged, kept in {write_dir}: {name}: {why}", err=True)
    if report.failed:
        sys.exit(1)
