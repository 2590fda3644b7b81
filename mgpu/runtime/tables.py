"""Tables a notebook shows as a value: rows of measurements, formatted once, rendered by Jupyter.

A notebook cell ends with a :class:`Table` instead of printing a hand-aligned table: Jupyter draws
it as HTML, papermill's text output and ``print`` get aligned plain text. Columns keep the order of
the first row; a value is formatted with the column's format (``formats={"val acc": ".3f"}``), and
a missing value shows as a dash, and text in a column of numbers (``"FAILED"``) as it is.
"""

from __future__ import annotations

import html
from typing import Any, Iterable, Mapping


class Table:
    """Rows of named values (dicts), shown as a table."""

    def __init__(self, rows: Iterable[Mapping[str, Any]], formats: Mapping[str, str] | None = None,
                 title: str | None = None):
        self.rows = [dict(r) for r in rows]
        self.formats = dict(formats or {})
        self.title = title
        self.columns: list[str] = []
        for row in self.rows:
            self.columns += [c for c in row if c not in self.columns]
        unknown = set(self.formats) - set(self.columns)
        if unknown:
            raise ValueError(f"formats for columns the table does not have: {sorted(unknown)}")

    def column(self, name: str) -> list:
        """One column's values, in row order (None where a row lacks it)."""
        if name not in self.columns:
            raise KeyError(f"no column {name!r}: the columns are {self.columns}")
        return [row.get(name) for row in self.rows]

    def cell(self, row: Mapping[str, Any], column: str) -> str:
        value = row.get(column)
        if value is None:
            return "-"
        spec = self.formats.get(column)
        if spec is None or isinstance(value, str):  # a note in a column of numbers is shown as it is
            return f"{value:.4g}" if isinstance(value, float) else str(value)
        return format(value, spec)

    def _cells(self) -> list[list[str]]:
        return [[self.cell(row, c) for c in self.columns] for row in self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    def __str__(self) -> str:
        cells = self._cells()
        widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(self.columns)]

        def line(values, first_left=True):
            return "  ".join(v.ljust(w) if (i == 0 and first_left) else v.rjust(w)
                             for i, (v, w) in enumerate(zip(values, widths)))

        out = [self.title] if self.title else []
        out += [line(self.columns), line(["-" * w for w in widths])] + [line(r) for r in cells]
        return "\n".join(out)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r) + "</tr>" for r in self._cells())
        caption = f"<caption>{html.escape(self.title)}</caption>" if self.title else ""
        return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
