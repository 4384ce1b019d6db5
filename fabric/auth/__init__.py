"""Who a request acts as and what it may do.

Owns: roles and the :class:`~fabric.auth.principal.Principal` every frontend
checks (:mod:`.principal`), and tokens kept in the catalog database with the S3
key pairs derived from them (:mod:`.tokens`).

May import: :mod:`fabric.catalog`, :mod:`fabric.format`, :mod:`fabric.util`,
:mod:`fabric.errors`.
"""
