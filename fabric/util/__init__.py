"""Shared infrastructure with no knowledge of fabric's data: human sizes, progress
reporting, small networking helpers, SQLite connections whose durability the
caller states (:mod:`.sqlite`).

May import: the standard library and :mod:`fabric.errors` only.
"""
