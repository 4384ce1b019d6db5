"""How a server sends a file's bytes: small answers read whole, larger ones streamed in
pieces of about a MiB.

A streamed body costs a worker-thread hop and a socket write per piece. Large REST GETs (16
connections, 16 MiB objects) went at 317-372 MB/s with one 64 KiB chunk per piece and at
461-640 MB/s with 1 MiB pieces (bench/RESULTS.md, "Streamed answers in 1 MiB pieces").
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

#: The size a streamed answer's pieces are joined up to.
PIECE = 1 << 20
#: Answers up to this size are read whole in the handler's worker thread and sent in one piece:
#: no streaming hops, and a read that fails answers with an error status, not a cut-off 200.
READ_WHOLE_MAX = 1 << 20


def in_pieces(parts: Iterable[bytes], size: int = PIECE) -> Iterator[bytes]:
    """``parts`` joined into pieces of at least ``size`` bytes (the last one may be smaller),
    each a ``bytes``; the order and the bytes are unchanged."""
    pending: list[bytes] = []
    held = 0
    for part in parts:
        pending.append(part)
        held += len(part)
        if held >= size:
            yield bytes(pending[0]) if len(pending) == 1 else b"".join(pending)
            pending, held = [], 0
    if pending:
        yield bytes(pending[0]) if len(pending) == 1 else b"".join(pending)
