"""Text tables of the terminal report: a frame printed as pandas' `to_string(index=False,
na_rep="-")` prints it, at most TEXT_MAX_ROWS rows. Frames of text, integer and float columns are
laid out here directly (the same text, tested against pandas); any other goes to pandas."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

TEXT_MAX_ROWS = 40


def text_table(frame: pd.DataFrame, title: str, note: str = "") -> str:
    if frame.empty:
        return f"{title}\n  (none)\n"
    shown = frame.head(TEXT_MAX_ROWS)
    text = plain_text_grid(shown)
    if text is None:
        text = printable(shown).to_string(index=False, na_rep="-")
    more = len(frame) - len(shown)
    tail = f"\n  ... {more} more rows (all of them with --format csv or --out DIR)" if more else ""
    note = f"\n{note}" if note else ""
    return f"{title}{note}\n{text}{tail}\n"


_ESCAPED = ("\t", "\r", "\n")  # pandas prints these escaped


def plain_text_grid(shown: pd.DataFrame) -> str | None:
    """What `printable(shown).to_string(index=False, na_rep="-")` prints, for a frame of text
    and integer columns (the report's own tables); None for any other (floats: pandas' common
    precision), which pandas formats. pandas' formatter costs a millisecond a table: most of
    the text report. Like pandas: each column right-justified to its widest cell, the header
    of an integer column one space further, columns one space apart."""
    if (isinstance(shown.columns, pd.MultiIndex)
            or pd.get_option("display.unicode.east_asian_width")
            or pd.get_option("display.colheader_justify") != "right"
            or pd.get_option("display.float_format") is not None
            or pd.get_option("display.chop_threshold") is not None):
        return None
    cells = []
    for label, column in shown.items():
        if type(label) is not str or label.startswith(" ") or _escaped(label):
            return None
        dtype = column.dtype
        if isinstance(dtype, np.dtype) and dtype.kind in "iu":
            texts, header = [str(v) for v in column.to_numpy().tolist()], " " + label
        elif dtype == np.float64:
            texts, header = _float_texts(column.to_numpy()), " " + label
        elif isinstance(dtype, pd.api.extensions.ExtensionDtype):
            texts, header = _plain_texts(column.to_numpy(dtype=object, na_value="-")), label
        elif dtype.kind == "O":  # None printed as such: na_rep is for NaN
            texts, header = _plain_texts(column.to_numpy()), label
        else:
            return None
        if texts is None:
            return None
        width = max(len(header), *map(len, texts))
        cells.append([header.rjust(width), *(text.rjust(width) for text in texts)])
    return "\n".join(" ".join(row) for row in zip(*cells))


_DECIMAL_NUMBER = re.compile(r"^\s*[+-]?[0-9]+\.[0-9]*$")


def _float_texts(values: np.ndarray) -> list[str] | None:
    """The cells pandas prints for a float column: every value to display.precision digits,
    then the trailing zeros all numbers share dropped (one kept after the point), NaN as "-";
    None where pandas would switch to scientific notation."""
    digits = pd.get_option("display.precision")
    magnitudes = np.abs(values)
    with np.errstate(invalid="ignore"):
        if ((magnitudes < 10 ** (-digits)) & (magnitudes > 0)).any():
            return None
        large = (magnitudes > 1e6).any()
    texts = ["-" if value != value else f"{value:.{digits}f}" for value in values.tolist()]
    if large and max(map(len, texts)) > digits + 6:
        return None
    numbers = [_DECIMAL_NUMBER.match(text) is not None for text in texts]
    if not any(numbers):
        return texts
    while all(text.endswith("0") for text, number in zip(texts, numbers) if number):
        texts = [text[:-1] if number else text for text, number in zip(texts, numbers)]
    return [text + "0" if number and text.endswith(".") else text
            for text, number in zip(texts, numbers)]


def _plain_texts(values: np.ndarray) -> list[str] | None:
    """The cells pandas prints for an object column of strings, Python ints and None; None
    for any other value."""
    texts = []
    for value in values.tolist():
        if type(value) is str and not _escaped(value):
            texts.append(value)
        elif type(value) is int or value is None:
            texts.append(str(value))
        else:
            return None
    return texts


def _escaped(text: str) -> bool:
    return any(char in text for char in _ESCAPED)


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
