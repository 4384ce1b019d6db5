"""The base of decorators around a data plane (retry, metrics...).

As with the object-store wrappers (:mod:`fabric.store.wrappers`), cross-cutting
behaviour is written once around the interface, never at call sites or inside
each implementation. A wrapper passes every public method call of the plane it
wraps through :meth:`PlaneWrapper.around`; attributes and private names are
delegated unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any


class PlaneWrapper:
    """Delegates to ``inner``; subclasses override :meth:`around`."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def around(self, name: str, call: Callable[..., Any], args: tuple, kwargs: Mapping[str, Any]) -> Any:
        """Run one call of method ``name`` (``call`` is the inner plane's bound method)."""
        return call(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name.startswith("_") or not callable(attr):
            return attr

        @functools.wraps(attr)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            return self.around(name, attr, args, kwargs)

        self.__dict__[name] = wrapped  # bound once: later lookups skip __getattr__
        return wrapped
