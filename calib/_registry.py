"""One registry idiom for every kind of named component (datasets, models, losses, methods).

A registry can be given a ``populate`` function that fills it on first read (calib's registries run
:func:`calib.plugins.load_components`: the built-in components, then the plugins), and remembers which
plugin registered each name (:func:`registering_as`, :meth:`Registry.origin`).
"""

from __future__ import annotations

import contextlib
import fnmatch
import importlib
import pkgutil
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

from calib._config import did_you_mean
from calib._deprecation import renamed_message

T = TypeVar("T")

__all__ = ["Registry", "UnknownNameError", "import_submodules", "registering_as"]

_registering: list[Any] = []  # the plugin whose module is being imported now (innermost last)


@contextlib.contextmanager
def registering_as(origin: Any) -> Iterator[None]:
    """Attribute every registration made inside the block to ``origin`` (a plugin)."""
    _registering.append(origin)
    try:
        yield
    finally:
        _registering.pop()


class UnknownNameError(KeyError):
    """An unknown registry name; the message lists close matches and every valid name."""

    def __str__(self) -> str:
        return str(self.args[0])


class Registry(Generic[T]):
    """Maps stable snake_case names to factories or classes.

    >>> LOSSES = Registry("loss")
    >>> @LOSSES.register("ce")
    ... def make_ce(): return "ce"
    >>> LOSSES.names()
    ['ce']
    """

    def __init__(self, kind: str, *, populate: Callable[[], None] | None = None) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._aliases: dict[str, str] = {}
        self._warned_aliases: set[str] = set()
        self._origins: dict[str, Any] = {}
        self._populate = populate
        self.version = 0
        """Counts the registrations: what is built from a registry is rebuilt when it changes."""

    def _read(self) -> dict[str, T]:
        if self._populate is not None:
            self._populate()
        return self._entries

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator registering ``obj`` under ``name``; a duplicate name is a ``ValueError``."""

        def decorator(obj: T) -> T:
            if name in self._entries or name in self._aliases:
                by = self._origins.get(name)
                raise ValueError(f"{self.kind} {name!r} is already registered" + (f" (by {by})" if by else ""))
            self._entries[name] = obj
            self.version += 1
            if _registering:
                self._origins[name] = _registering[-1]
            return obj

        return decorator

    def alias(self, former: str, name: str, *, warn: bool = False) -> None:
        """Accept ``former`` (a renamed entry's old name) wherever ``name`` is read: :meth:`get`, :meth:`create`,
        ``in``, :meth:`canonical`; :meth:`names` and :meth:`items` list ``name`` only. ``warn``: :meth:`get` under
        ``former`` warns (``DeprecationWarning``), for a registry users read by name; one that calib reads stored
        names from stays silent."""
        if former in self._entries or former in self._aliases:
            raise ValueError(f"{self.kind} {former!r} is already registered")
        self._aliases[former] = name
        if warn:
            self._warned_aliases.add(former)

    def canonical(self, name: str) -> str:
        """``name``, or the name a :meth:`alias` maps it to."""
        self._read()
        return self._aliases.get(name, name)

    def origin(self, name: str) -> Any:
        """The plugin that registered ``name``; None for calib's own components."""
        self._read()
        return self._origins.get(name)

    def declared(self, name: str) -> T | None:
        """``name``'s entry as registered so far, None if none, without filling the registry (a module that
        registers asks this while the registry is being filled)."""
        return self._entries.get(name)

    def get(self, name: str) -> T:
        """The entry registered under ``name`` (or an alias of it); an unknown name lists close matches and all
        names."""
        if name in self._warned_aliases:
            warnings.warn(renamed_message(f"{self.kind} {name!r}", repr(self._aliases[name])), DeprecationWarning,
                          stacklevel=2)
        name = self.canonical(name)
        if name not in self._read():
            hint = did_you_mean(str(name), self._entries, n=3)
            raise UnknownNameError(
                f"Unknown {self.kind} {name!r}.{hint} Valid {self.kind} names: {', '.join(self.names())}."
            )
        return self._entries[name]

    def create(self, name: str, **kwargs: Any) -> Any:
        """Call the entry registered under ``name`` with ``kwargs``."""
        return self.get(name)(**kwargs)  # type: ignore[operator]

    def items(self) -> list[tuple[str, T]]:
        """(name, entry) pairs in registration order (calib's own first, then the plugins')."""
        return list(self._read().items())

    def names(self, pattern: str = "*") -> list[str]:
        """Sorted registered names matching the fnmatch ``pattern``."""
        return sorted(n for n in self._read() if fnmatch.fnmatchcase(n, pattern))

    def __contains__(self, name: object) -> bool:
        return name in self._read() or name in self._aliases

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._read())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"


def import_submodules(package: str, path: Iterable[str]) -> None:
    """Import every module of ``package`` (its ``__path__``) whose name does not start with ``_``: the modules of a
    component package register themselves, so adding one is one new file."""
    for module in pkgutil.iter_modules(path):
        if not module.name.startswith("_"):
            importlib.import_module(f"{package}.{module.name}")
