"""What the cause tests of a late rank read (analysis.findings.late_causes), gathered once per run
from every rank's reduction (analysis.rank.step_evidence, computed where its trace was parsed)
and records (docs/report.md, "Why a rank is late"):

- `ops`: per rank and traced step, each compute op (GEMM, convolution, attention) with its input
  shapes (Kineto's `Input Dims`, recorded by default) and its duration; on GPU traces each
  compute kernel too, by name (a kernel's name carries its tile shapes; its time is the
  device's, where a host op's time on a GPU trace is its launch);
- `host`: per rank and traced step, the step's time, the time in the DataLoader's next batch,
  the time outside every host op, and the time in each host op name (`names`);
- `samples`: per rank and recorded step, the sampler's host CPU, process CPU, SM clock, power and
  temperature (medians of the samples inside the step, on the records' clock);
- `ranks`: per rank, its host, device name and the CPUs it may run on (its manifest).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis.core.model import UNKNOWN_RANK
from analysis.rank.step_evidence import (
    COMPUTE_OP_COLUMNS,
    HOST_COLUMNS,
    NAME_COLUMNS,
    object_frame,
    step_of,
)
from tracer import schema

SAMPLE_COLUMNS = ["rank", "step", "cpu_system_pct", "cpu_process_pct", "sm_clock_mhz",
                  "power_w", "temp_c"]
MACHINE_COLUMNS = ["rank", "host", "device", "cpus"]


@dataclass(frozen=True, eq=False)
class LateEvidence:
    """The evidence of every rank (the module's docstring says what each frame holds)."""

    ops: pd.DataFrame = field(default_factory=lambda: object_frame(COMPUTE_OP_COLUMNS))
    host: pd.DataFrame = field(default_factory=lambda: object_frame(HOST_COLUMNS))
    names: pd.DataFrame = field(default_factory=lambda: object_frame(NAME_COLUMNS))
    samples: pd.DataFrame = field(default_factory=lambda: object_frame(SAMPLE_COLUMNS))
    ranks: pd.DataFrame = field(default_factory=lambda: object_frame(MACHINE_COLUMNS))


def _step_samples(rank: int, records) -> pd.DataFrame:
    samples, steps = records.samples, records.steps
    if samples is None or samples.empty or steps is None or steps.empty:
        return object_frame(SAMPLE_COLUMNS)
    frame = samples.assign(step=step_of(samples["t_ns"].to_numpy(dtype=np.int64), steps))
    frame = frame[frame["step"] >= 0]
    columns = [c for c in SAMPLE_COLUMNS[2:] if c in frame.columns]
    if frame.empty or not columns:
        return object_frame(SAMPLE_COLUMNS)
    numbers = frame[columns].apply(pd.to_numeric, errors="coerce").astype("float64")
    per = numbers.groupby(frame["step"]).median().reset_index().assign(rank=rank)
    return per.reindex(columns=SAMPLE_COLUMNS)


def _rank_row(trace) -> dict:
    starts = [r for r in (trace.records.manifest if trace.records is not None else [])
              if isinstance(r, schema.RunStart)]
    start = starts[0] if starts else None
    return {"rank": int(trace.rank), "host": getattr(start, "host", None),
            "device": getattr(start, "device_name", None), "cpus": getattr(start, "cpus", None)}


def late_evidence(traces, late: set | frozenset = frozenset(), others: int | None = None
                  ) -> LateEvidence:
    """The evidence of the ranks of `traces` (RankTrace): the samples and manifest of every
    rank; the ops and host times of every rank, or with `others` given, of the `late` ranks and
    at most `others` more (the lowest-numbered: enough for the medians the tests compare). A
    rank without a trace gives its samples and manifest only; the ops and host times come from
    each rank's reduction (its `step_evidence`), never from its events."""
    ops, host, names, samples, ranks = [], [], [], [], []
    known = sorted(int(t.rank) for t in traces or [] if t.rank != UNKNOWN_RANK)
    read = (set(known) if others is None else
            set(late) | set([r for r in known if r not in late][:others]))
    for trace in traces or []:
        if trace.rank == UNKNOWN_RANK:
            continue
        ranks.append(_rank_row(trace))
        if trace.records is not None:
            samples.append(_step_samples(int(trace.rank), trace.records))
        if (int(trace.rank) not in read or not trace.has_trace
                or not getattr(trace, "event_count", 0)):
            continue
        evidence = trace.table("step_evidence")
        if evidence is None:
            continue
        ops.append(evidence.compute_ops())
        host.append(evidence.host)
        names.append(evidence.names)

    def joined(frames: list, columns: list[str]) -> pd.DataFrame:
        frames = [f for f in frames if len(f)]
        return pd.concat(frames, ignore_index=True) if frames else object_frame(columns)

    return LateEvidence(ops=joined(ops, COMPUTE_OP_COLUMNS), host=joined(host, HOST_COLUMNS),
                        names=joined(names, NAME_COLUMNS),
                        samples=joined(samples, SAMPLE_COLUMNS),
                        ranks=pd.DataFrame(ranks, columns=MACHINE_COLUMNS))
