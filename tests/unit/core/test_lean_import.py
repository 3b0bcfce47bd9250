"""analysis.core.lean_import: a command's pandas comes without pyarrow's modules, with the same
text dtype its frames use, and pyarrow can still be imported after it."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd

from analysis.core.lean_import import import_pandas_without_arrow

_FRESH = """
import sys
from analysis.core.lean_import import import_pandas_without_arrow
pd = import_pandas_without_arrow()
print("pyarrow imported with pandas:", "pyarrow" in sys.modules)
print("text storage:", pd.Series(["a", None]).dtype.storage)
import pyarrow
print("pyarrow importable after:", pyarrow.__name__)
"""


def test_a_fresh_process_gets_pandas_without_pyarrow_and_can_import_pyarrow_after():
    shown = subprocess.run([sys.executable, "-c", _FRESH], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    assert shown == ["pyarrow imported with pandas: False", "text storage: python",
                     "pyarrow importable after: pyarrow"]


def test_a_process_that_has_pandas_keeps_it_as_it_is():
    assert import_pandas_without_arrow() is pd
    assert "pyarrow" not in sys.modules or sys.modules["pyarrow"] is not None
