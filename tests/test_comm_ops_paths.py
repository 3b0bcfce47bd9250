"""comm_ops builds a trace's ops from the events' values (comm_events.op_columns); the frame
of comm_events.ops_from_events must give the same ops, row for row."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.ingest.load import load_path
from analysis.rank import issuers
from analysis.rank.comm import ops as communication
from analysis.rank.comm.events import ops_from_events
from conftest import DATA

TRACES = [
    DATA / "hta" / "nccl_parser_config" / "nccl_data.json.gz",
    DATA / "hta" / "cpu_only" / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    DATA / "hta" / "trace_filter" / "sampled_rank-0.json.gz",
    DATA / "hta" / "ns_resolution_trace" / "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
]


def _via_frame(trace) -> pd.DataFrame:
    """comm_ops through ops_from_events' frame, the way it was built before op_columns."""
    frame = ops_from_events(trace.events, trace.steps, trace.all_steps, trace.rank,
                            trace.world_size)
    frame["issuer"] = issuers.issuers_from_trace(trace, frame.reset_index(drop=True)).to_numpy()
    names = issuers.group_names(trace)
    frame["pg_desc"] = [issuers.group_desc(pg, desc) or names.get(pg)
                        for pg, desc in zip(frame["pg"], frame["pg_desc"])]
    return communication._frame_of(communication._with_bandwidths(
        communication._typed_columns(frame)))


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.parent.name)
def test_comm_ops_equals_the_ops_from_events_frame(path):
    trace = load_path(path, use_cache=False).ranks[0]
    ops = communication.comm_ops(trace)
    assert len(ops) > 0
    pd.testing.assert_frame_equal(ops, _via_frame(trace), check_exact=True)


def test_comm_ops_equals_the_ops_from_events_frame_with_steps_left_out():
    trace = load_path(TRACES[0], steps=[5], use_cache=False).ranks[0]
    ops = communication.comm_ops(trace)
    assert set(ops["step"].dropna()) == {5}
    pd.testing.assert_frame_equal(ops, _via_frame(trace), check_exact=True)
