"""The storage and wire format: how bytes become chunks, frames and packs, and the
immutable data model (entries, commits, listings) with its encodings.

Owns: content-defined chunking and chunk ids (:mod:`.chunking`), frames
(:mod:`.frames`), packs (:mod:`.packs`), entries and commits (:mod:`.model`),
result types of listings and diffs (:mod:`.listing`), the chunking pipeline
that turns a stream into an entry (:mod:`.ingest`), the rules for names
and paths (:mod:`.paths`), and the namespace rule of file-system views (a
directory shadows a file of the same name, :mod:`.namespace`), how hard-link
groups are stored (:mod:`.links`), and entry kinds as POSIX file types
(:mod:`.filetypes`). Everything
here is pure: no storage, no network.

May import: :mod:`fabric.util`, :mod:`fabric.errors`.
"""
