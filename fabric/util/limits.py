"""The open-file limit of a long-running service (hub, spoke, mount).

A service holds a descriptor per connection and per open file it serves, and a reader of a
spoke's cache files (:mod:`fabric.client.spoke_files`) holds up to 256 at once in each of a
mount's threads. The soft limit many service managers and shells give, 1,024, is within
reach of one busy mount; past it every ``open`` and ``accept`` fails with EMFILE. The hard
limit is the administrator's choice, and raising the soft limit up to it needs no privilege,
so each service does so when it starts, as Go's runtime does for every program.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger("fabric")

#: The soft limit asked for when the hard limit is unlimited (the kernel's own cap,
#: ``fs.nr_open``, is 1,048,576 by default).
UNLIMITED_TARGET = 1 << 20


def raise_open_files_limit() -> int:
    """Raise this process's soft limit of open files to its hard limit (never lowering it);
    the soft limit in force afterwards. A refusal is logged and leaves the limit as it was."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = UNLIMITED_TARGET if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
    return soft
