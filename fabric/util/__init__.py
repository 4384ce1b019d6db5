"""Shared infrastructure with no knowledge of fabric's data: human sizes, progress
reporting, small networking helpers, SQLite connections whose durability the
caller states (:mod:`.sqlite`), and a lock that keeps a directory to one
process (:mod:`.dirlock`).

May import: the standard library and :mod:`fabric.errors` only.
"""
