"""The scaling study: runs of one workload at several world sizes, compared (docs/scaling.md).

    python -m analysis.scaling RUN [RUN ...] [--mode strong|weak] [--format text|json|csv]

A RUN is a run folder or a folder holding run folders (a sweep of `python -m tracer.sweep`).
`load_run` turns one run into a row of plain figures and its bandwidth table; the numbers are
computed by the pure functions of `analysis.scaling.table`; only `main` prints.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from analysis.core.command_options import add_parse_options
from analysis.core.frames import with_text_in_python
from analysis.core.model import UNKNOWN_RANK
from analysis.core.step_spec import positive_number
from analysis.core.terminal import terminal_safe
from analysis.ingest.runs import NothingToAnalyse, find_runs, is_run_dir, stray_notes
from analysis.report.values import plain, records
from analysis.scaling import table as st
from tracer import schema
from tracer.options import help_format

DOCUMENT_VERSION = 1
MIB = 1 << 20


@dataclass
class Study:
    """Every table of a scaling study, and what could not be read."""

    runs: pd.DataFrame
    table: pd.DataFrame
    attribution: pd.DataFrame
    bandwidth: pd.DataFrame
    mode: dict
    problems: list[str] = field(default_factory=list)
    # what makes the numbers doubtful (table.warnings): a noisy baseline, efficiency above 100%
    warnings: list[str] = field(default_factory=list)
    # JSON files that are neither traces nor records (this study's own output saved in the
    # sweep folder), ignored
    notes: list[str] = field(default_factory=list)


def run_folders(paths: list[Path]) -> list[Path]:
    """Each PATH that is a run folder, and every run folder inside each one that is not."""
    folders = []
    for path in paths:
        if not path.is_dir():
            raise NothingToAnalyse(f"{path}: no such folder")
        found = [path] if is_run_dir(path) else find_runs(path)
        if not found:
            raise NothingToAnalyse(f"{path}: neither a run folder nor a folder of runs")
        folders += found
    return folders


def _manifest_starts(ranks: list) -> list:
    return [r for t in ranks if t.records is not None for r in t.records.manifest
            if isinstance(r, schema.RunStart)]


def _frame(ranks: list, name: str) -> pd.DataFrame:
    frames = [getattr(t.records, name) for t in ranks
              if t.records is not None and len(getattr(t.records, name))]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def load_run(path: Path, samples_per_step: float | None = None,
             warmup_steps: int = st.DEFAULT_WARMUP_STEPS, use_cache: bool = True,
             peak_tflops: float | None = None, jobs: int | None = None,
             comm_kernels: tuple = ()) -> tuple[dict, pd.DataFrame, list[str]]:
    """One run's row (`scaling_table.run_row` plus run, path, world_size, nnodes, stragglers,
    the MFU), its transfer-based bandwidth table and its problems. The breakdown, the cross-rank
    pass and the MFU are the run's analysis's (analysis.run: `peak_tflops` overrides every
    rank's peak), each computed once; `jobs` and `comm_kernels` as the load takes them."""
    from analysis.crossrank.report_tables import rank_bars
    from analysis.run.analysed_run import Run
    from analysis.run.loading import load_run_path

    loaded = load_run_path(path, use_cache=use_cache, jobs=jobs, comm_kernels=comm_kernels)
    run = Run(loaded, name=path.name, path=str(path), peak_tflops=peak_tflops)
    problems = list(loaded.problems)
    steps = _frame(loaded.ranks, "steps")
    samples = _frame(loaded.ranks, "samples")
    starts = _manifest_starts(loaded.ranks)
    if samples_per_step is None:
        configured = [s.config.get("samples_per_step") for s in starts
                      if isinstance(s.config, dict)]
        samples_per_step = next((v for v in configured if isinstance(v, (int, float)) and v > 0),
                                None)
    world_size = loaded.world_size or max((s.world_size for s in starts if s.world_size),
                                          default=None)
    if world_size is None:
        world_size = len({t.rank for t in loaded.ranks if t.rank != UNKNOWN_RANK}) or None
    nnodes = len({s.host for s in starts}) or 1
    if steps.empty:
        problems.append(f"{path}: no step records (rank*.steps.jsonl): the run has no step time "
                        f"to compare; trace it with python -m tracer.record")
    per_step = run.breakdown
    cross = run.cross_rank
    waits = cross.waits if cross is not None else None
    shares = st.part_shares(rank_bars(per_step, waits)) if len(per_step) else None
    if shares is None and not steps.empty:
        problems.append(f"{path}: no profiled step in its Kineto traces: step time and "
                        f"throughput only, no parts")
    cpu = (float(samples["cpu_system_pct"].median())
           if "cpu_system_pct" in samples.columns and samples["cpu_system_pct"].notna().any()
           else float("nan"))
    row = st.run_row(steps, shares, samples_per_step, warmup_steps, cpu) if not steps.empty \
        else {"step_ms": float("nan")}
    kinds = set(per_step["kind"].dropna()) if "kind" in per_step.columns else set()
    row.update(trace_kind="gpu" if "gpu" in kinds else ("cpu" if kinds else None))
    fired = cross.stragglers if cross is not None else pd.DataFrame()
    stragglers = ([int(r) for r in fired.loc[fired["fires"].astype(bool), "rank"]]
                  if len(fired) else [])
    row.update(run=path.name, path=str(path), world_size=world_size, nnodes=nnodes,
               stragglers=",".join(map(str, stragglers)),
               mfu_pct=_mean_mfu(run.mfu) if len(per_step) else float("nan"))
    problems += [f"{path}: {problem}" for problem in run.problems_met]
    bandwidth = cross.bandwidth if cross is not None else pd.DataFrame()
    bandwidth = bandwidth.assign(run=path.name, world_size=world_size, nnodes=nnodes)
    return row, bandwidth, problems


def _mean_mfu(mfu: pd.DataFrame | None) -> float:
    """The run's MFU, %: the mean over every rank's profiled steps of its mfu table; NaN where
    no rank has one (or the table failed: the run's problems say why)."""
    if mfu is None or not len(mfu):
        return float("nan")
    values = pd.to_numeric(mfu["mfu_pct"], errors="coerce")
    return float(values.mean()) if values.notna().any() else float("nan")


def study(paths: list[Path], mode: str | None = None, samples_per_step: float | None = None,
          warmup_steps: int = st.DEFAULT_WARMUP_STEPS, use_cache: bool = True,
          peak_tflops: float | None = None, jobs: int | None = None,
          comm_kernels: tuple = ()) -> Study:
    """Load every run that `paths` name and compare them; `peak_tflops` overrides every rank's
    peak in the MFU column; `jobs` and `comm_kernels` as the load takes them."""
    rows, bandwidths, problems = [], [], []
    folders = run_folders(paths)
    notes = [n for f in dict.fromkeys([*paths, *folders]) for n in stray_notes(f)]
    for folder in folders:
        try:
            row, bandwidth, found = load_run(folder, samples_per_step, warmup_steps, use_cache,
                                             peak_tflops, jobs, comm_kernels)
        except NothingToAnalyse as exc:
            problems.append(f"{folder}: {exc}")
            continue
        problems += found
        if row.get("world_size") is None:
            problems.append(f"{folder}: world size unknown (no manifest, no distributedInfo); "
                            f"left out")
            continue
        rows.append(row)
        bandwidths.append(bandwidth)
    runs = pd.DataFrame(rows)
    if runs.empty or runs["step_ms"].isna().all():
        raise NothingToAnalyse("no run with step records to compare")
    table, mode_info = st.scaling_table(runs, mode)
    if mode_info["note"]:
        problems.append(mode_info["note"])
    bandwidth = _bandwidth_table(pd.concat(bandwidths, ignore_index=True))
    return Study(runs=runs, table=table, attribution=st.attribution(table),
                 bandwidth=bandwidth, mode=mode_info, problems=problems,
                 warnings=st.warnings(table), notes=notes)


def _bandwidth_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Transfer-based busbw per world size, op and size bucket: the mean over repeats."""
    if frame.empty or "transfer_busbw_gbps" not in frame.columns:
        return pd.DataFrame(columns=["world_size", "nnodes", "op", "size_bucket", "count",
                                     "transfer_busbw_gbps"])
    grouped = frame.groupby(["world_size", "nnodes", "op", "size_bucket"], sort=True)
    return grouped.agg(count=("count", "sum"),
                       transfer_busbw_gbps=("transfer_busbw_gbps", "mean")).reset_index()


# ---- output ----------------------------------------------------------------------------------
TEXT_COLUMNS = [("world_size", "ranks", "{:.0f}"), ("nnodes", "nodes", "{:.0f}"),
                ("runs", "runs", "{:.0f}"), ("step_ms", "step ms", "{:.2f}"),
                ("steps_per_s", "steps/s", "{:.2f}"), ("samples_per_s", "samples/s", "{:.1f}"),
                ("speedup", "speedup", "{:.2f}"), ("efficiency_pct", "eff %", "{:.1f}"),
                ("compute_pct", "compute %", "{:.1f}"), ("transfer_pct", "transfer %", "{:.1f}"),
                ("waiting_pct", "waiting %", "{:.1f}"), ("idle_pct", "idle %", "{:.1f}"),
                ("comm_share_pct", "comm %", "{:.1f}"), ("mfu_pct", "MFU %", "{:.1f}"),
                ("peak_memory_mib", "peak MiB", "{:.0f}"),
                ("host_cpu_pct", "host cpu %", "{:.0f}")]


def _cell(value, form: str) -> str:
    value = plain(value)
    return "-" if value is None else form.format(value)


def text_report(result: Study) -> str:
    table = result.table.assign(peak_memory_mib=result.table["peak_memory_bytes"] / MIB)
    mode = result.mode
    how = ("from the recorded global batch" if mode["by_samples"]
           else "assumed" if mode["note"] else "given")
    lines = [f"Scaling study: {len(result.runs)} runs, {mode['mode']} scaling ({how}); "
             f"baseline {int(table['world_size'].iloc[0])} rank(s)", ""]
    if result.warnings:
        lines += ["Warnings:"] + [f"  ! {w}" for w in result.warnings] + [""]
    header = [label for _, label, _ in TEXT_COLUMNS]
    body = [[_cell(row.get(c), form) for c, _, form in TEXT_COLUMNS]
            for _, row in table.iterrows()]
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(header)]
    lines.append("  ".join(h.rjust(w) for h, w in zip(header, widths)))
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in body]
    spread = table[table["runs"] > 1]
    for _, row in spread.iterrows():
        lines.append(f"  {int(row['world_size'])} ranks: step {row['step_ms_min']:.2f}-"
                     f"{row['step_ms_max']:.2f} ms over {int(row['runs'])} repeats")
    lines += ["", "Where the efficiency goes (efficiency points lost against the baseline):"]
    if result.attribution.empty:
        lines.append("  (no parts: the runs need Kineto traces of a few steps)")
    for (world, nnodes), causes in result.attribution.groupby(["world_size", "nnodes"]):
        row = table[(table["world_size"] == world) & (table["nnodes"] == nnodes)].iloc[0]
        lines.append(f"  {world} ranks on {nnodes} node(s): efficiency "
                     f"{row['efficiency_pct']:.1f}% ({100 - row['efficiency_pct']:.1f} points "
                     f"lost, {row['step_ms'] - row['ideal_step_ms']:+.2f} ms per step)")
        stragglers = result.runs.loc[result.runs["world_size"] == world, "stragglers"]
        named = sorted({r for s in stragglers.dropna() for r in str(s).split(",") if r})
        for _, cause in causes.sort_values("lost_pct_points", ascending=False).iterrows():
            lines.append(f"    {cause['cause']:<18} {cause['lost_pct_points']:+6.1f} points "
                         f"({cause['lost_ms']:+.2f} ms)")
        for _, cause in st.main_causes(causes).iterrows():
            extra = (f" (ranks wait for rank {', '.join(named)})"
                     if cause["cause"] == "waiting for peers" and named else "")
            lines.append(f"    -> {cause['cause']}{extra}: {cause['suggestion']}")
    if not result.bandwidth.empty:
        lines += ["", "Transfer-based busbw (GB/s) per collective and size:"]
        for _, row in result.bandwidth.iterrows():
            lines.append(f"  {int(row['world_size'])} ranks  {row['op']:<14} "
                         f"{row['size_bucket']:<14} {int(row['count']):>6} ops  "
                         f"{row['transfer_busbw_gbps']:.3f}")
    return "\n".join(lines)


def document(result: Study) -> dict:
    return {"schema_version": DOCUMENT_VERSION, "mode": result.mode["mode"],
            "mode_from_samples": result.mode["by_samples"], "problems": result.problems,
            "warnings": result.warnings,
            "runs": records(result.runs), "world_sizes": records(result.table),
            "attribution": records(result.attribution), "bandwidth": records(result.bandwidth)}


PROG = "python -m analysis.scaling"


def add_study_options(group: argparse._ArgumentGroup) -> None:
    """How the runs are compared, for this command and the sweep that ends in it: --mode,
    --samples-per-step, --warmup-steps."""
    group.add_argument("--mode", choices=["strong", "weak"],
                       help="strong: the same global batch at every world size; weak: a "
                            "global batch growing with it (default: from the recorded "
                            "samples per step, else strong)")
    group.add_argument("--samples-per-step", type=float, metavar="N",
                       help="global batch per step, for runs that did not record it (default: "
                            "the recorded one)")
    group.add_argument("--warmup-steps", type=int, default=st.DEFAULT_WARMUP_STEPS,
                       metavar="N", help="first steps left out of the step time")


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = help_format.parser(
        prog, "Compare runs of one workload at several world sizes: step time, throughput, "
              "speedup, efficiency and where the lost efficiency went (docs/scaling.md).")
    parser.add_argument("paths", nargs="+", type=Path, metavar="RUN",
                        help="a run folder, or a folder of runs (a sweep)")
    which = parser.add_argument_group("what to compare")
    add_study_options(which)
    which.add_argument("--peak-tflops", type=positive_number, metavar="TFLOPS",
                       help="every rank's peak for the MFU column (default: each run's "
                            "recorded or measured peak, else the device's datasheet; "
                            "docs/mfu.md)")
    output = parser.add_argument_group("output")
    output.add_argument("--format", choices=["text", "json", "csv"], default="text",
                        help="standard output: the report, one JSON document, or the CSV table")
    output.add_argument("--svg", type=Path, metavar="FILE",
                        help="also write the efficiency plot with a stacked bar per world size "
                             "(default: none written)")
    output.add_argument("--html", type=Path, metavar="FILE",
                        help="also write a self-contained page with the plot and the report "
                             "(default: none written)")
    add_parse_options(parser)
    return parser


def parse_args(argv: list[str] | None = None, prog: str = PROG) -> argparse.Namespace:
    return build_parser(prog).parse_args(argv)


@with_text_in_python
def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    args = parse_args(argv, prog)
    try:
        result = study(args.paths, args.mode, args.samples_per_step, args.warmup_steps,
                       use_cache=not args.no_cache, peak_tflops=args.peak_tflops,
                       jobs=args.jobs, comm_kernels=tuple(args.comm_kernel))
    except NothingToAnalyse as exc:
        print(terminal_safe(f"ranktrace: error: {exc}"), file=sys.stderr)
        return 1
    for note in result.notes:
        print(terminal_safe(f"ranktrace: note: {note}"), file=sys.stderr)
    for problem in result.problems:
        print(terminal_safe(f"ranktrace: warning: {problem}"), file=sys.stderr)
    if args.format == "json":
        print(terminal_safe(json.dumps(document(result), indent=1)))
    elif args.format == "csv":
        for warning in result.warnings:  # text and JSON carry them; CSV has no place for them
            print(terminal_safe(f"ranktrace: warning: {warning}"), file=sys.stderr)
        print(terminal_safe(result.table.to_csv(index=False)), end="")
    else:
        print(terminal_safe(text_report(result)))
    if args.svg is not None:
        from analysis.scaling.efficiency_plot import scaling_svg
        args.svg.write_text(scaling_svg(result.table, result.warnings))
    if args.html is not None:
        from analysis.scaling.efficiency_plot import scaling_page
        title = "ranktrace scaling study: " + ", ".join(str(p) for p in args.paths)
        args.html.write_text(scaling_page(title, result.table, text_report(result),
                                          result.warnings))
        print(terminal_safe(f"ranktrace: wrote {args.html}"), file=sys.stderr)
    return 0
