"""``fabric mount-flush``: stage what a killed ``--writeback`` mount parked, without mounting.

A ``--writeback`` mount killed before it staged its parked files leaves them in the journal
of its ``--write-dir`` (:mod:`fuse.journal`), and the next mount started with that directory
takes them over (:meth:`fuse.writeback.WriteBack.adopt`). When no mount of that branch will
run on this machine again (the pod went to another node, the job ended), this stages them
on their branches directly: each file is chunked, its new chunks sent and its entry staged
at the durability asked, with the mode, owner, times and metadata its record holds, and only
then is its record dropped. Of two records of one path the later wins, as in a mount.

The journal's lock is taken as a mount takes it, so a flush and a mount never share a
write directory. A file that cannot be staged (its branch is gone, the server refuses it)
keeps its record for a later flush or mount; the others are staged all the same. A server
that is away, or refuses the token, ends the flush at the first file (every record kept).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from fabric.errors import BadRequest, ChunksMissing, FabricError, Unauthorized, Unavailable
from fabric.format.model import Entry
from fabric.plane.dataplane import DataPlane
from fabric.util.progress import Progress
from fuse.journal import DIRNAME, Journal, Record
from fuse.writer import WFile


@dataclass
class FlushReport:
    staged: list[str] = field(default_factory=list)  # REPO@BRANCH:PATH, in the order staged
    staged_bytes: int = 0
    superseded: int = 0  # older records of a path a later record replaced (dropped)
    failed: dict[str, str] = field(default_factory=dict)  # REPO@BRANCH:PATH -> why (record kept)
    committed: dict[str, str] = field(default_factory=dict)  # REPO@BRANCH -> commit id

    def to_json(self) -> dict:
        return dict(self.__dict__)


def flush_journal(
    write_dir: str, plane: DataPlane, durability: str | None = None, commit_message: str | None = None, progress: Progress | None = None
) -> FlushReport:
    """Stage every file the journal of ``write_dir`` holds (see the module's docstring);
    ``commit_message``: then commit each branch a file was staged on; ``progress`` hears of
    the bytes of each file as it is staged. BadRequest if ``write_dir`` holds no journal;
    DirectoryInUse while a mount (or flush) uses it."""
    progress = progress or Progress()
    if not os.path.isdir(os.path.join(write_dir, DIRNAME)):
        raise BadRequest(f"{write_dir!r} holds no write-back journal (no {DIRNAME}/ in it): it is not the --write-dir of a --writeback mount")
    journal = Journal(write_dir)
    report = FlushReport()
    try:
        latest, report.superseded = journal.latest()
        branches: list[tuple[str, str]] = []
        progress.start(sum(_size(journal, r) for r in latest), "B", "staging parked files")
        away: Unavailable | Unauthorized | None = None
        for record in latest:
            name = f"{record.repo}@{record.branch}:{record.path}"
            if away is not None:  # the server is away or refuses the token: no use trying each file
                report.failed[name] = f"not tried: {away}"
                continue
            try:
                size = _stage(journal, record, plane, durability)
            except (Unavailable, Unauthorized) as exc:
                away = exc
                report.failed[name] = str(exc)
                continue
            except (FabricError, OSError) as exc:
                report.failed[name] = str(exc)
                continue
            journal.drop(record.id)
            report.staged.append(name)
            report.staged_bytes += size
            progress.advance(size)
            if (record.repo, record.branch) not in branches:
                branches.append((record.repo, record.branch))
        if commit_message is not None:
            for repo, branch in branches:
                report.committed[f"{repo}@{branch}"] = plane.commit(repo, branch, commit_message).id
    finally:
        progress.close()
        journal.close()
    return report


def _size(journal: Journal, record: Record) -> int:
    try:
        return os.stat(journal.data_path(record.id)).st_size
    except OSError:
        return 0


def _stage(journal: Journal, record: Record, plane: DataPlane, durability: str | None) -> int:
    """Chunk and stage the file of ``record``; its size."""
    fd = os.open(journal.data_path(record.id), os.O_RDONLY | os.O_CLOEXEC)
    try:
        entry = _entry(record, fd, plane)
        try:
            plane.stage(record.repo, record.branch, {record.path: entry}, durability)
        except ChunksMissing:  # the server lost chunks it took (a spoke restarted): send them again
            plane.stage(record.repo, record.branch, {record.path: _entry(record, fd, plane)}, durability)
        return entry.size
    finally:
        os.close(fd)


def _entry(record: Record, fd: int, plane: DataPlane) -> Entry:
    """The file's entry, as a mount that took the record over would stage it, its chunks
    stored at the server."""
    return WFile.recovered(record, fd, "", None).upload(plane, record.repo)
