"""Clients of a data plane: the REST API as a data plane over HTTP
(:mod:`.http`) over one server or the nearest healthy of a list (:mod:`.servers`), import and export of local directories over any data plane
(:mod:`.transfer`), and writing into a local directory without ever following
a link out of it (:mod:`.destdir`); a circuit breaker that makes calls to an
unresponsive server fail fast (:mod:`.breaker`).

May import: :mod:`fabric.plane` and the layers below it; never the engine or a
service.
"""
