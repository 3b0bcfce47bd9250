"""The windows of one rank's critical path (docs/critical-path.md, "Windows"): its
ProfilerSteps, the occurrences of a user annotation (--window, --instance), or, in a trace
without ProfilerStep, the whole trace as one window (step -1).

    path_windows.windows(trace, events, window) -> (steps frame, chained)
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core.event_kinds import (
    GPU_CATS,
    HOST_OP_CATS,
    PROFILER_STEP_RE,
    RUNTIME_CATS,
    normal_cat,
)
from analysis.core.frames import steps_frame
from analysis.core.step_spec import PathWindow

WHOLE_TRACE = -1  # the step number of the whole trace as one window


def windows(steps: pd.DataFrame | None, events: pd.DataFrame,
            window: PathWindow | None) -> tuple[pd.DataFrame, bool]:
    """(step, start_ns, end_ns of each window, whether consecutive windows follow each other).

    Without `window`: the ProfilerSteps `steps` (selected), which follow each other; with none,
    the whole trace, from its first op's start to its last op's end (host ops, runtime calls
    and device ops: not the profiler's own span, which opens before them). With `window`: the
    host annotations (user_annotation on the host) whose name contains `window.name`,
    numbered 0, 1, ... in order of start, `window.instance` alone where given; they follow
    each other only where all are ProfilerSteps (other annotations have other work between
    them). Raises ValueError naming the window where it matches nothing, and where its
    occurrences overlap (a name that matches nested annotations) without `window.instance`."""
    if window is None:
        if steps is not None and len(steps):
            return steps[["step", "start_ns", "end_ns"]], True
        traced = np.flatnonzero(_cat_in(events, HOST_OP_CATS | RUNTIME_CATS | GPU_CATS))
        if not len(traced):
            return steps_frame(), True
        return steps_frame([WHOLE_TRACE], [int(events["ts_ns"].to_numpy("int64")[traced].min())],
                           [int(events["end_ns"].to_numpy("int64")[traced].max())]), True
    names = events["name"]
    codes = names.cat.codes.to_numpy()
    categories = [str(c) for c in names.cat.categories]
    wanted = np.array([window.name in c for c in categories] + [False])[codes]
    host_op = _cat_in(events, HOST_OP_CATS)
    rows = np.flatnonzero(wanted & host_op & ~events["is_gpu"].to_numpy(bool))
    if not len(rows):
        raise ValueError(f"--window {window.name!r}: no host annotation of that name in the "
                         f"trace")
    start = events["ts_ns"].to_numpy("int64")[rows]
    end = events["end_ns"].to_numpy("int64")[rows]
    order = np.argsort(start, kind="stable")
    start, end = start[order], end[order]
    number = np.arange(len(rows))
    if window.instance is not None:
        if window.instance >= len(rows):
            raise ValueError(f"--window {window.name!r}: --instance {window.instance} asked, "
                             f"the trace has {len(rows)} (0-{len(rows) - 1})")
        keep = [window.instance]
        start, end, number = start[keep], end[keep], number[keep]
    elif (start[1:] < end[:-1]).any():
        matched = sorted({categories[c] for c in codes[rows]})
        raise ValueError(f"--window {window.name!r}: its occurrences overlap (it matches "
                         f"{', '.join(repr(m) for m in matched[:4])}): give a name that "
                         f"matches one annotation, or --instance")
    chained = all(PROFILER_STEP_RE.match(categories[c]) for c in np.unique(codes[rows]))
    return steps_frame(number, start, end), chained


def _cat_in(events: pd.DataFrame, cats) -> np.ndarray:
    """Per event, whether its (normalised) category is one of `cats`."""
    column = events["cat"]
    return np.array([normal_cat(c) in cats for c in column.cat.categories]
                    + [False])[column.cat.codes.to_numpy()]
