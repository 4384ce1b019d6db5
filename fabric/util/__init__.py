"""Shared infrastructure with no knowledge of fabric's data: human sizes, progress
reporting, small networking helpers.

May import: the standard library and :mod:`fabric.errors` only.
"""
