"""Clients of a data plane: the REST API as a data plane over HTTP
(:mod:`.http`), and import and export of local directories over any data plane
(:mod:`.transfer`).

May import: :mod:`fabric.plane` and the layers below it; never the engine or a
service.
"""
