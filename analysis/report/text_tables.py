"""Text tables of the terminal report: a frame printed by pandas' `to_string(index=False,
na_rep="-")`, at most TEXT_MAX_ROWS rows."""

from __future__ import annotations

import pandas as pd

TEXT_MAX_ROWS = 40


def text_table(frame: pd.DataFrame, title: str, note: str = "") -> str:
    if frame.empty:
        return f"{title}\n  (none)\n"
    shown = frame.head(TEXT_MAX_ROWS)
    text = printable(shown).to_string(index=False, na_rep="-")
    more = len(frame) - len(shown)
    tail = f"\n  ... {more} more rows (all of them with --format csv or --out DIR)" if more else ""
    note = f"\n{note}" if note else ""
    return f"{title}{note}\n{text}{tail}\n"


def printable(shown: pd.DataFrame) -> pd.DataFrame:
    """`shown` with its extension-typed columns (Int64, str, ...) as objects, "-" where missing:
    to_string's na_rep reaches only numpy columns. Built as one new frame: an assignment per
    column costs more than the table's formatting."""
    extension = [isinstance(dtype, pd.api.extensions.ExtensionDtype) for dtype in shown.dtypes]
    if not any(extension):
        return shown
    columns = {i: pd.Series(column.to_numpy(dtype=object, na_value="-"), index=shown.index,
                            dtype=object) if is_extension else column
               for i, ((_, column), is_extension) in enumerate(zip(shown.items(), extension))}
    printable = pd.DataFrame(columns, index=shown.index)
    printable.columns = shown.columns
    return printable
