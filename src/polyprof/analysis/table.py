"""The tables analyses return: named columns, rows as tuples, a DataFrame when pandas is installed.

::

    table = kernel_breakdown(trace)
    table.columns                 # ("device", "kernel", "calls", "total_ns", ...)
    for row in table.dicts(): ... # {"device": "GPU 0", "kernel": "gemm", ...}
    table.to_pandas()             # a pandas.DataFrame (pandas is not a dependency of polyprof)

Not a DataFrame itself: pandas costs a third of a second to import and is not installed with
polyprof; every table converts in one call where it is.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Table:
    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    title: str = ""

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.rows)

    def column(self, name: str) -> list[Any]:
        i = self.columns.index(name)
        return [r[i] for r in self.rows]

    def dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, r, strict=True)) for r in self.rows]

    def where(self, **equal: Any) -> Table:
        """The rows whose columns equal the values given: ``table.where(device="GPU 0")``."""
        idx = [(self.columns.index(k), v) for k, v in equal.items()]
        return Table(self.columns, [r for r in self.rows if all(r[i] == v for i, v in idx)], self.title)

    def to_pandas(self) -> Any:
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("Table.to_pandas() needs pandas: pip install pandas") from None
        return pd.DataFrame(self.rows, columns=list(self.columns))

    @classmethod
    def of(cls, columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str = "") -> Table:
        return cls(tuple(columns), [tuple(r) for r in rows], title)

    @classmethod
    def of_arrow(cls, table: Any, title: str = "") -> Table:
        """A pyarrow Table's rows (an engine's result) as a Table."""
        return cls(tuple(table.column_names), [tuple(r.values()) for r in table.to_pylist()], title)
