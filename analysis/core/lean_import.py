"""pandas imported by a command without pyarrow's modules.

pandas imports pyarrow and pyarrow.compute as it is imported, wherever pyarrow is installed: a
quarter of its import time (about 50 ms of a command's 0.5 s on a 50 MB trace,
docs/benchmarks.md). The commands use no Arrow-backed dtype: their frames keep text as Python
strings (analysis.core.frames.text_in_python), which is what pandas does without pyarrow, so the
results are the same. pyarrow itself stays importable afterwards, for the Parquet cache
(analysis.ingest.cache), which converts with pyarrow's own code. A process that has imported
pandas or pyarrow already (a notebook, a test) keeps them as they are. Only a command whose
frames are all made in its own process, or in children forked from it, may use it: a worker
started otherwise (a process pool's under another start method, a Dask cluster's) has its own
pandas, whose text columns are pyarrow's where it is installed, and this one could not read
them.
"""

from __future__ import annotations

import sys
from types import ModuleType


def import_pandas_without_arrow() -> ModuleType:
    """pandas, imported now (if it is not yet) as if pyarrow were not installed."""
    hidden = "pandas" not in sys.modules and "pyarrow" not in sys.modules
    if hidden:
        # None in sys.modules makes `import pyarrow` raise ImportError, which pandas takes as
        # pyarrow not installed (pandas.compat.pyarrow); removed at once, so that a later
        # import finds it.
        sys.modules["pyarrow"] = None
    try:
        import pandas
    finally:
        if hidden and sys.modules.get("pyarrow", False) is None:
            del sys.modules["pyarrow"]
    return pandas
