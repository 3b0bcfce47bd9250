"""Communication kernels named by the host op that launched them: older traces name and size
the op on the host only, and their kernels' own names do not say which op they run."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.rank.comm.event_ops import kernel_host_ops

# What a kernel without its own collective arguments takes from the host op that launched it.
_HOST_ARGS = ("in_nelems", "out_nelems", "comm_dtype", "group_size", "pg_name", "input_dims",
              "input_type")


def named_kernels(events: pd.DataFrame, hosts: pd.DataFrame | None = None) -> pd.DataFrame:
    """A trace's communication events with each NCCL/RCCL kernel that carries no collective
    name named by the host op around its launch (analysis.rank.comm.event_ops.kernel_host_ops), from
    which it also takes the message arguments it lacks: older traces name and size the op on
    the host only (`nccl:all_reduce` with its "Input Dims"), and their kernels' own names
    (`ncclKernel_SendRecv_...` for every collective) do not say which op they run. `hosts`:
    kernel_host_ops(events), where the caller has it."""
    comm = events[events["is_comm"].astype(bool)]
    is_kernel = comm["is_gpu"].astype(bool)
    unnamed = is_kernel & (comm["collective"].isna() if "collective" in comm.columns else True)
    if not unnamed.any():
        return comm
    hosts = kernel_host_ops(events) if hosts is None else hosts
    hosts = hosts[(hosts["host"] >= 0) & hosts.index.isin(comm.index[unnamed])]
    if hosts.empty:
        return comm
    # Labels are unique (the trace reader numbers its events): one array write per column,
    # where .loc writes by label would cost several times the work.
    rows = comm.index.get_indexer(hosts.index)
    source = events.index.get_indexer(hosts["host"].to_numpy())
    columns = {"collective": hosts["op"].to_numpy()}
    for column in _HOST_ARGS:
        if column in events.columns:
            taken = _objects(events[column], source)
            if column in comm.columns:
                own = _objects(comm[column], rows)
                taken = np.where(pd.isna(own), taken, own)
            columns[column] = taken
    named = {}
    for column, values in columns.items():
        # Object columns, as every written column has been: pandas would read an object array
        # of text as its string dtype.
        whole = (_objects(comm[column]) if column in comm.columns
                 else np.full(len(comm), None, dtype=object))
        whole[rows] = values
        named[column] = pd.Series(whole, index=comm.index, dtype=object, copy=False)
    return comm.assign(**named)


def _objects(column: pd.Series, positions: np.ndarray | None = None) -> np.ndarray:
    """The column's values (at `positions`, all for None) as a new object array, each as
    column.astype(object) holds it (a float64 as a Python float)."""
    if isinstance(column.dtype, np.dtype):
        values = column.to_numpy()
        return (values if positions is None else values[positions]).astype(object)
    if positions is not None:
        column = column.iloc[positions]
    return column.astype(object).to_numpy().copy()
