"""Selecting events by name and by thread (analysis.core.events.matches,
analysis.rank.layers.on_threads), on frames built as the parser types them
(analysis.core.frames) with known answers: names asked only among some rows, past 127
categories, and threads among thousands of other pids."""

import numpy as np

from analysis.core.events import matches
from analysis.core.frames import events_frame
from analysis.rank import layers


def _events(names=None, pid=None, tid=None):
    """An events frame of host ops: the given names, pids and tids, the others alike."""
    rows = len(next(c for c in (names, pid, tid) if c is not None))
    return events_frame({"name": names or ["op"] * rows, "cat": ["cpu_op"] * rows,
                         "ts_ns": list(range(rows)), "dur_ns": [1] * rows,
                         "pid": pid or ["1"] * rows, "tid": tid or ["1"] * rows})


def test_matches_among_asks_only_the_rows_given():
    names = ["aten::mm", None, "ncclKernel_AllReduce", "aten::mm", "DataLoader#next"]
    among = np.array([True, True, False, True, True])
    asked = []

    def wanted(name):
        asked.append(name)
        return name.startswith(("aten::", "ncclKernel"))

    column = _events(names)["name"]
    found = matches(column, wanted, among=among)
    assert found.tolist() == [True, False, False, True, False]
    assert "ncclKernel_AllReduce" not in asked  # a category only unasked rows hold
    full = matches(column, wanted)
    assert full.tolist() == [True, False, True, True, False]
    assert (found == (full & among)).all()


def test_matches_reads_names_past_127_categories():
    # int16 codes: the categories past int8's range are asked and read like the others.
    names = [f"op{i}" for i in range(130)]
    column = _events(names)["name"]
    among = np.zeros(130, dtype=bool)
    among[[0, 127, 129]] = True
    found = matches(column, lambda n: n in ("op127", "op129", "op128"), among=among)
    assert np.flatnonzero(found).tolist() == [127, 129]
    assert matches(column, lambda n: True).all()


def test_on_threads_of_few_and_of_thousands_of_pids():
    wanted = {("1", "7"), ("2", "7"), ("3", "9")}
    pid, tid = ["1", "1", "2", None, "2", "1"], ["7", "8", "7", "7", None, "7"]
    expected = [True, False, True, False, False, True]
    few = _events(pid=pid, tid=tid)
    # Thousands of other pids: a table of flags per pid and tid would outgrow the frame.
    many = _events(pid=pid + [f"x{i}" for i in range(3000)], tid=tid + ["7"] * 3000)
    assert layers.on_threads(few, wanted).tolist() == expected
    assert layers.on_threads(many, wanted).tolist() == expected + [False] * 3000
    assert layers.on_threads(many, {("x2999", "7")}).tolist() == [False] * 3005 + [True]
    assert not layers.on_threads(few, {("9", "9")}).any()
    assert not layers.on_threads(many, {("9", "9")}).any()
