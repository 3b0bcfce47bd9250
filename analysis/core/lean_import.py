"""pandas imported by a command without pyarrow's modules.

pandas imports pyarrow and pyarrow.compute as it is imported, wherever pyarrow is installed: a
quarter of its import time (about 50 ms of a command's 0.5 s on a 50 MB trace,
docs/benchmarks.md). The commands use no Arrow-backed dtype: their frames keep text as Python
strings (analysis.core.frames.text_in_python), which is what pandas does without pyarrow, so the
results are the same. pyarrow itself stays importable afterwards, for the Parquet cache
(analysis.ingest.cache), which converts with pyarrow's own code. A process that has imported
pandas or pyarrow already (a notebook, a test) keeps them as they are.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType


def import_pandas_without_arrow() -> ModuleType:
    """pandas, imported now (if it is not yet) as if pyarrow were not installed."""
    if "pandas" in sys.modules or "pyarrow" in sys.modules:
        return importlib.import_module("pandas")
    # None in sys.modules makes `import pyarrow` raise ImportError, which pandas takes as
    # pyarrow not installed (pandas.compat.pyarrow); removed at once, so that a later import
    # finds it.
    sys.modules["pyarrow"] = None
    try:
        return importlib.import_module("pandas")
    finally:
        if sys.modules.get("pyarrow", False) is None:
            del sys.modules["pyarrow"]
