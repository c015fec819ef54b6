"""The :class:`Table` container."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, List, Mapping, Optional, Sequence

from .render import Align, render


class Table:
    """Column headers plus rows of values (any objects; shown with ``str``)."""

    def __init__(self, headers: Sequence[str], rows: Iterable[Sequence[Any]] = ()) -> None:
        self.headers = list(headers)
        if len(set(self.headers)) != len(self.headers):
            raise ValueError(f"duplicate column names: {self.headers!r}")
        self.rows: List[List[Any]] = []
        for row in rows:
            self.add_row(row)

    @classmethod
    def from_dicts(cls, records: Iterable[Mapping[str, Any]], columns: Optional[Sequence[str]] = None) -> "Table":
        """Build a table from mappings; missing keys become ``None``.

        Columns default to the keys in order of first appearance.
        """
        records = list(records)
        if columns is None:
            seen: dict = {}
            for record in records:
                for key in record:
                    seen.setdefault(key, None)
            columns = list(seen)
        return cls(columns, ([record.get(c) for c in columns] for record in records))

    def add_row(self, row: Sequence[Any]) -> None:
        if len(row) != len(self.headers):
            raise ValueError(f"row has {len(row)} values, expected {len(self.headers)}")
        self.rows.append(list(row))

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[List[Any]]:
        return iter(self.rows)

    def _index(self, name: str) -> int:
        try:
            return self.headers.index(name)
        except ValueError:
            raise KeyError(f"no column named {name!r}; columns are {self.headers!r}") from None

    def column(self, name: str) -> List[Any]:
        """All values of column *name*."""
        i = self._index(name)
        return [row[i] for row in self.rows]

    def select(self, *names: str) -> "Table":
        """A new table with only the given columns, in the given order."""
        idx = [self._index(n) for n in names]
        return Table(names, ([row[i] for i in idx] for row in self.rows))

    def sort_by(self, name: str, *, reverse: bool = False, key: Optional[Callable[[Any], Any]] = None) -> "Table":
        """A new table sorted by column *name*; ``None`` values go last."""
        i = self._index(name)
        present = [row for row in self.rows if row[i] is not None]
        missing = [row for row in self.rows if row[i] is None]
        keyfunc = (lambda row: key(row[i])) if key else (lambda row: row[i])
        return Table(self.headers, sorted(present, key=keyfunc, reverse=reverse) + missing)

    def render(self, style: str = "plain", align: Align = "auto") -> str:
        return render(self.headers, self.rows, style, align)

    def __str__(self) -> str:
        return self.render()
