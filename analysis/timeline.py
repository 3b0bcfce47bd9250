"""`python -m analysis.timeline RUN`: one gzip Chrome-trace / Perfetto file with every rank.

Every time is put on the common clock of the cross-rank analysis (analysis.crossrank: the
tracer's clock_sync offsets, else an estimate from collective completions); a rank it cannot
place keeps its own clock. One process per rank, `rank R (host)`, holds its Kineto threads and
streams, a track of step markers, a track of its collectives and p2p ops, and counter tracks from
its device samples and step records; flows join the op of the rank that arrived last at a
collective to the ops of the ranks that waited for it; one more process holds the critical path
across ranks (docs/critical-path.md), a slice per segment. Layout and use: docs/viewing.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.core.command_options import add_parse_options
from analysis.core.frames import with_text_in_python
from analysis.core.model import UNKNOWN_RANK, LoadResult
from analysis.core.step_spec import (
    format_ranges,
    parse_step_spec,
    positive_number,
    steps_argument,
)
from analysis.core.terminal import terminal_safe
from analysis.ingest.load import LoadOptions
from analysis.ingest.runs import NothingToAnalyse, resolve
from analysis.report import timeline_events as te
from analysis.report.progress import Progress
from analysis.run.loading import load_run
from tracer import schema
from tracer.options import help_format

DEFAULT_NAME = "timeline.trace.gz"  # not *.json.gz: the run folder's loader would read it back
DEFAULT_MAX_MB = 200.0
MB = 1e6


def _offset_of(clock: pd.DataFrame, rank: int):
    """own clock -> common clock of one rank, as crossrank's to_common_clock does."""
    table = clock.set_index("rank") if len(clock) else None
    if table is None or rank not in table.index:
        return lambda ns: np.asarray(ns, dtype="int64")
    offset = float(table.loc[rank, "offset_ns"])
    drift = float(np.nan_to_num(table.loc[rank, "drift_ns_per_s"])) / 1e9  # NaN: none fitted
    t0 = clock.attrs.get("t0", 0)

    def shift(ns):
        own = np.asarray(ns, dtype="int64")
        return own - np.rint(offset + drift * (own - t0).astype("float64")).astype("int64")

    return shift


def _sync_clock(clock_sync: pd.DataFrame) -> pd.DataFrame:
    """The manifest's clock_sync offsets as a clock table, when the cross-rank pass failed."""
    table = clock_sync.assign(drift_ns_per_s=0.0)[["rank", "offset_ns", "drift_ns_per_s"]]
    table.attrs["t0"] = 0
    return table


def gather(run: LoadResult) -> dict:
    """Per rank on the common clock: events, trace steps, step records, samples, ops, host;
    plus the clock table, the critical path's segments (None where unknown) and the problems
    met."""
    from analysis.crossrank import analyse, critical_path
    from analysis.crossrank.run_frames import run_frames
    from analysis.rank.layers import training_threads

    frames = run_frames(run)
    problems = []
    segments = None
    try:
        cross = analyse(frames["ops"], frames["steps"], frames["clock_sync"],
                        frames["world_size"], frames["events"])
        clock, ops = cross.clock, cross.ops
    except Exception as exc:  # the timeline is still worth drawing on the tracer's offsets
        problems.append(f"cross-rank analysis failed ({type(exc).__name__}: {exc}); "
                        f"using the tracer's clock_sync offsets and no flows")
        clock, ops, cross = _sync_clock(frames["clock_sync"]), None, None
    if cross is not None:
        try:
            segments = critical_path.analyse(cross, frames["steps"]).critical_path_segments
        except Exception as exc:  # the rest of the timeline stands without it
            problems.append(f"critical path analysis failed ({type(exc).__name__}: {exc}); "
                            f"no critical path track")
    ranks = {}
    for trace in run.ranks:
        if trace.rank == UNKNOWN_RANK:
            continue
        to_common = _offset_of(clock, trace.rank)
        kineto_shift = int(frames["kineto_shift"].get(trace.rank, 0))
        # Every event is drawn: the rank's own (the cross-rank pass kept only its host spans),
        # on the clock of its ops, then the common one.
        events = (trace.with_events().events if trace.rank in frames["events"] else None)
        if events is not None and len(events):
            events = events.assign(ts_ns=to_common(events["ts_ns"] - kineto_shift),
                                   end_ns=to_common(events["end_ns"] - kineto_shift))
        records = trace.records
        host, record_steps, samples = None, None, None
        if records is not None:
            host = next((r.host for r in records.manifest if isinstance(r, schema.RunStart)),
                        None)
            if len(records.steps):
                record_steps = records.steps.assign(start_ns=to_common(records.steps["start_ns"]),
                                                    end_ns=to_common(records.steps["end_ns"]))
            if len(records.samples):
                samples = records.samples.assign(t_ns=to_common(records.samples["t_ns"]))
        trace_steps = trace.steps.assign(
            start_ns=to_common(trace.steps["start_ns"] - kineto_shift),
            end_ns=to_common(trace.steps["end_ns"] - kineto_shift))
        ranks[trace.rank] = {
            "events": events, "trace_steps": trace_steps, "record_steps": record_steps,
            "samples": samples, "host": host,
            "training": training_threads(trace.events) if len(trace.events) else set(),
            "ops": ops[ops["rank"] == trace.rank] if ops is not None else None,
        }
    return {"ranks": ranks, "clock": clock, "ops": ops, "critical_path": segments,
            "problems": problems}


def window_steps(ranks: dict, chosen: list[int] | None = None) -> pd.DataFrame:
    """(rank, step, start_ns, end_ns) of the window's steps: the analysed ProfilerSteps (or
    `chosen` ones), from the step records where the trace lacks them."""
    parts = []
    for rank, data in ranks.items():
        steps = data["trace_steps"]
        if chosen is not None:
            steps = steps[steps["step"].isin(chosen)]
            records = data["record_steps"]
            if records is not None:
                extra = records[records["step"].isin(chosen) & ~records["step"].isin(
                    steps["step"])]
                steps = pd.concat([steps, extra[["step", "start_ns", "end_ns"]]])
        elif steps.empty and data["record_steps"] is not None:
            steps = data["record_steps"]
        parts.append(steps[["step", "start_ns", "end_ns"]].assign(rank=rank))
    if not parts:
        return pd.DataFrame(columns=["rank", "step", "start_ns", "end_ns"])
    return pd.concat(parts, ignore_index=True)[["rank", "step", "start_ns", "end_ns"]]


def _window(steps: pd.DataFrame, ranks: dict) -> tuple[int, int]:
    if len(steps):
        return int(steps["start_ns"].min()), int(steps["end_ns"].max())
    spans = [(int(d["events"]["ts_ns"].min()), int(d["events"]["end_ns"].max()))
             for d in ranks.values() if d["events"] is not None and len(d["events"])]
    if not spans:
        return 0, 0
    return min(s for s, _ in spans), max(e for _, e in spans)


def _inside(frame: pd.DataFrame | None, start: int, end: int, begin="start_ns", stop="end_ns"):
    if frame is None or frame.empty:
        return frame
    return frame[(frame[begin] < end) & (frame[stop] > start)]


def _samples_around(samples: pd.DataFrame | None, start: int, end: int):
    """The samples of the window and the one on each side of it: a window shorter than the
    sampling period still shows the values around it."""
    if samples is None or samples.empty:
        return samples
    ordered = samples.sort_values("t_ns", kind="stable")
    t = ordered["t_ns"].to_numpy("int64")
    first = max(int(np.searchsorted(t, start, side="right")) - 1, 0)
    last = int(np.searchsorted(t, end, side="left")) + 1
    return ordered.iloc[first:last]


def _ops_frame(ops: pd.DataFrame) -> pd.DataFrame:
    args = [{"bytes": None if b != b else int(b), "wait_for_peers_us": round(w / 1e3, 3),
             "transfer_us": round(t / 1e3, 3), "last_arriver": int(last), "step": int(step)}
            for b, w, t, last, step in zip(ops["bytes"], ops["wait_ns"], ops["transfer_ns"],
                                           ops["last_rank"], ops["step"])]
    return pd.DataFrame({
        "name": [te.op_label(o, b, pg) for o, b, pg in zip(ops["op"], ops["bytes"], ops["pg"])],
        "cat": "collective", "ts_ns": ops["issue_ns"].to_numpy("int64"),
        "end_ns": ops["end_ns"].to_numpy("int64"), "args": args})


def build(gathered: dict, steps: pd.DataFrame) -> dict:
    """The trace document for the window spanned by `steps` (window_steps rows)."""
    ranks = gathered["ranks"]
    start, end = _window(steps, ranks)
    origin = start
    trace_events: list[dict] = []
    op_places: dict = {}
    all_ops = []
    for rank in sorted(ranks):
        data = ranks[rank]
        host = f" ({data['host']})" if data["host"] else ""
        names = {te.STEPS_TID: "steps", te.COLLECTIVES_TID: "collectives and p2p (tracer)"}
        threads = [(te.STEPS_TID, names[te.STEPS_TID], 0),
                   (te.COLLECTIVES_TID, names[te.COLLECTIVES_TID], 1)]
        parts, tracks = [], []
        marker_source = data["record_steps"] if data["record_steps"] is not None \
            else data["trace_steps"]
        markers = _inside(marker_source, start, end)
        if markers is not None and len(markers):
            parts.append(pd.DataFrame({
                "name": [f"step {int(s)}" for s in markers["step"]], "cat": "step",
                "ts_ns": markers["start_ns"].to_numpy("int64"),
                "end_ns": markers["end_ns"].to_numpy("int64"), "args": None}))
            tracks.append(np.full(len(markers), te.STEPS_TID))
        ops = _inside(data["ops"], start, end, "issue_ns")
        if ops is not None and len(ops):
            parts.append(_ops_frame(ops))
            tracks.append(np.full(len(ops), te.COLLECTIVES_TID))
        events = _inside(data["events"], start, end, "ts_ns")
        if events is not None and len(events):
            kineto = te.track_names(events, data["training"])
            for row in kineto.itertuples():
                names[int(row.tid_out)] = row.name
                threads.append((int(row.tid_out), row.name, 2 + int(row.Index)))
            key = events["pid"].astype(str) + "\0" + events["tid"].astype(str) + "\0" + \
                events["is_gpu"].astype(str)
            lookup = dict(zip(kineto["pid"] + "\0" + kineto["tid"] + "\0" +
                              kineto["is_gpu"].astype(str), kineto["tid_out"]))
            parts.append(events[["name", "cat", "ts_ns", "end_ns"]].assign(args=None))
            tracks.append(key.map(lookup).to_numpy("int64"))
        if parts:
            frame = pd.concat(parts, ignore_index=True)
            slices, extra, tids = te.slices(frame, rank, origin, np.concatenate(tracks), names)
            threads += [(t, n, o) for t, n, o in extra]
            trace_events += slices
            if ops is not None and len(ops):
                first = len(parts[0]) if markers is not None and len(markers) else 0
                rows = ops.index.to_numpy()
                for row, tid in zip(rows, tids[first:first + len(ops)]):
                    op_places[int(row)] = (rank, int(tid))
                all_ops.append(ops)
        trace_events += te.sample_counters(_samples_around(data["samples"], start, end), rank,
                                           origin)
        trace_events += te.step_memory_counters(
            markers if data["record_steps"] is not None and markers is not None
            else pd.DataFrame(), rank, origin)
        trace_events += te.metadata(rank, f"rank {rank}{host}", rank, threads)
    if all_ops:
        ops = pd.concat(all_ops)
        flow_ops = gathered["ops"][gathered["ops"]["instance"].isin(ops["instance"])]
        flow_ops = flow_ops[flow_ops.index.isin(list(op_places))]
        trace_events += te.flows(flow_ops.assign(row=flow_ops.index), op_places, origin)
    segments = gathered.get("critical_path")
    if segments is not None:
        segments = _inside(segments[segments["step"].isin(steps["step"])], start, end)
    if segments is not None and len(segments):
        # its own process, numbered after every rank's
        trace_events += te.critical_path_events(segments, max(ranks, default=-1) + 1, origin)
    return {"traceEvents": trace_events, "displayTimeUnit": "ms",
            "otherData": {"ranktrace_origin_ns": origin,
                          "steps": sorted(int(s) for s in steps["step"].unique())}}


def encode(document: dict) -> bytes:
    return gzip.compress(json.dumps(document, separators=(",", ":")).encode(), compresslevel=6)


def write_timeline(gathered: dict, steps: pd.DataFrame, path: Path, max_bytes: float
                   ) -> tuple[list[int], list[int], int]:
    """Write the file, cut to the first steps of the window while it would pass `max_bytes`.
    Returns (steps asked, steps written, bytes written)."""
    asked = sorted(int(s) for s in steps["step"].unique())
    kept = asked
    data = encode(build(gathered, steps))
    while len(data) > max_bytes and len(kept) > 1:
        fewer = max(1, min(len(kept) - 1, int(len(kept) * max_bytes / len(data) * 0.9)))
        kept = kept[:fewer]
        data = encode(build(gathered, steps[steps["step"].isin(kept)]))
    path.write_bytes(data)
    return asked, kept, len(data)


PROG = "python -m analysis.timeline"
RENAMED = {"--output": "--out"}  # old spelling -> new: still taken, with a warning


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = help_format.parser(
        prog, "Write one Chrome-trace / Perfetto file holding every rank of a run on one "
              "clock (docs/viewing.md).")
    parser.add_argument("run", metavar="RUN", type=Path,
                        help="a run folder, a folder of runs (the newest), or one trace file")
    which = parser.add_argument_group("what to draw")
    which.add_argument("--steps", metavar="SPEC", type=steps_argument,
                       help="steps to show, e.g. 3-5,7 (default: the analysed steps)")
    which.add_argument("--max-mb", type=positive_number, default=DEFAULT_MAX_MB, metavar="MB",
                       help="cut to fewer steps when the file would be larger")
    output = parser.add_argument_group("output")
    output.add_argument("-o", "--out", metavar="FILE", type=Path,
                        help=f"the file to write (default: RUN/{DEFAULT_NAME})")
    add_parse_options(parser)
    return parser


@with_text_in_python
def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    parser = build_parser(prog)
    args = parser.parse_args(help_format.renamed(sys.argv[1:] if argv is None else argv,
                                                 RENAMED, prog))
    chosen = parse_step_spec(args.steps) if args.steps else None
    try:
        resolved = resolve([args.run])
    except NothingToAnalyse as exc:
        print(terminal_safe(f"ranktrace: nothing to draw: {exc}"), file=sys.stderr)
        return 1
    for note in resolved.notes:
        print(terminal_safe(f"ranktrace: note: {note}"), file=sys.stderr)
    (run_dir, files), = resolved.runs
    with Progress() as progress:
        run = load_run(files, run_dir, LoadOptions(steps=chosen, use_cache=not args.no_cache,
                                                   jobs=args.jobs,
                                                   comm_kernels=tuple(args.comm_kernel)),
                       progress=progress)
    gathered = gather(run)
    for problem in run.problems + gathered["problems"]:
        print(terminal_safe(f"ranktrace: warning: {problem}"), file=sys.stderr)
    if not gathered["ranks"]:
        print(terminal_safe(f"ranktrace: nothing to draw: {args.run}: no rank"), file=sys.stderr)
        return 1
    folder = run.run_dir if run.run_dir is not None else args.run
    out = args.out or (folder if folder.is_dir() else folder.parent) / DEFAULT_NAME
    steps = window_steps(gathered["ranks"], chosen)
    try:
        asked, kept, size = write_timeline(gathered, steps, out, args.max_mb * MB)
    except OSError as exc:
        print(terminal_safe(f"ranktrace: error: {out}: cannot write ({exc.strerror or exc})"),
              file=sys.stderr)
        return 1
    if kept != asked:
        print(terminal_safe(f"ranktrace: the timeline of steps {_spec(asked)} would pass --max-mb "
              f"{args.max_mb:g}; cut to steps {_spec(kept)}"), file=sys.stderr)
    print(terminal_safe(f"ranktrace: wrote {out} ({size / MB:.1f} MB, {len(gathered['ranks'])} "
                        f"ranks); open it in https://ui.perfetto.dev or chrome://tracing"),
          file=sys.stderr)
    return 0


def _spec(steps: list[int]) -> str:
    return format_ranges(steps) if steps else "(none)"


if __name__ == "__main__":
    raise SystemExit(main())
