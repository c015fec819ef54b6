"""The lazy faces: a package's ``__init__.py`` that re-exports names from its modules,
each imported from its home module the first time it is asked for (PEP 562), so that
importing one module of a package imports no more than it needs.

A face lists each lazy name three times, and ``tests/test_architecture.py`` holds the
three together: imported under ``TYPE_CHECKING`` (for the type checker and readers),
in ``_HOMES`` (name -> home module, for the import at run time) and in ``__all__``
(with any names the face imports eagerly). It then takes its module hooks from here,
hidden from the type checker so that a misspelled name imported from the face is an
error rather than an ``object``::

    if not TYPE_CHECKING:
        __getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())

Neutral: it imports nothing of rollserve, and every row of the import table may use it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping


def lazy_names(
    package: str,
    homes: Mapping[str, str],
    namespace: MutableMapping[str, object],
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """A face's ``__getattr__`` and ``__dir__``. ``__getattr__`` imports ``homes[name]``
    and takes the name from it with ``getattr`` (a home may itself be a face), keeping
    it in the face's ``namespace`` so later lookups do not come back here; a name not
    in ``homes`` is an ``AttributeError``, as for any module. ``__dir__`` lists the
    names the face has now and its lazy ones."""

    def __getattr__(name: str) -> object:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value: object = getattr(importlib.import_module(home), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *homes})

    return __getattr__, __dir__
