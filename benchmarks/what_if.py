"""What-if answers against measurement, and what the critical path costs (docs/critical-path.md).

    python benchmarks/what_if.py [--steps 40] [--active 20] [--experiment NAME ...]
                                 [--cost RANK:MS] [--repeats 1] [--pin-ranks] [--speed-only]
                                 [--speed-steps 1000] [--speed-ranks 8]

1. Speed: the critical path and every what-if of a synthetic run of --speed-steps steps of
   --speed-ranks ranks (four all_reduces per step, one rank late), timed after the cross-rank
   pass that feeds it; then again with every rank given 20 ms of CPU time a step on one host,
   the answers served on and held to the host's cores (analysis.crossrank.what_if_cores:
   processor sharing and the bound).
2. Accuracy (CPU, gloo), per --experiment: a workload traced with a cost injected on one rank,
   the matching what-if from the loaded run, then the same command without the cost: its
   measured mean step time (rank{R}.steps.jsonl, the steps the what-if covered, every rank)
   beside the predicted one, side by side in one run, and the answer of the same run without
   the host's cores (neither shared nor bounded). The aim: within +-10% (the median of pairs).
   - ddp-straggle: workloads/ddp.py --straggle 1:25 (busy host work before the forward), the
     tracer's default options; the top what-if ("rank 1 on time");
   - ddp-straggle-tail: workloads/ddp.py --straggle-tail 1:25 (busy host work before the
     optimizer step: rank 1 ends each step late, the others wait at the next step's first
     all-reduce); "rank 1 on time";
   - pipeline-straggle: workloads/pipeline.py --straggle 1:20 (a slow stage: host work before
     its step's schedule); "pipeline bubble at its theoretical ...";
   - slow-data: workloads/ddp.py --slow-data 1:20 (rank 1's DataLoader sleeps in each batch);
     "no data loading gaps on rank 1"; slow-data-all: --slow-data all:20, every rank's,
     "no data loading gaps on any rank";
   - slow-data-threads: --slow-data 1:40 with --hidden 1024 --batch-size 256 and two
     intra-op threads a rank (OMP_NUM_THREADS=2): without the sleep the ranks' four threads
     share two cores (on a 2-core machine), where the bound of the host's cores holds the
     answer (docs/critical-path.md, "The host's cores").
   --cost RANK:MS replaces the injected cost of every experiment run; --repeats N runs N
   pairs (with, without) one after the other and compares the medians of the predicted and the
   measured step over the pairs, as run-to-run noise on a shared machine is as large as the
   model's error. --pin-ranks runs each rank on a core of its own (taskset -c LOCAL_RANK), so
   that the ranks do not contend for the cores (docs/critical-path.md, "Cost and accuracy").
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import pandas as pd  # noqa: E402

from analysis.crossrank import analyse as cross_rank_pass  # noqa: E402
from analysis.crossrank import critical_path, what_if_cores  # noqa: E402
from analysis.crossrank.run_frames import typed_ops  # noqa: E402
from analysis.run.analysed_run import open_run  # noqa: E402
from tests.helpers.launch import torchrun_env  # noqa: E402

MS = 1_000_000
STEP_NS = 50 * MS


def synthetic(steps: int, ranks: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Ops and steps: per step four all_reduces, each rank 1 ms of work before each, the last
    rank 3 ms more before the first; every op 1 ms of transfer after its last arrival, each
    rank's step end 1 ms after the last."""
    ops, rows = [], []
    for s in range(1, steps + 1):
        base = s * STEP_NS
        arrive = base + MS
        for k in range(4):
            last = arrive + (3 * MS if k == 0 else 0)
            end = last + MS
            for r in range(ranks):
                issue = last if r == ranks - 1 else arrive
                ops.append((r, "0", ranks, "all_reduce", 4096.0, "float32", s, issue, end,
                            float("nan"), "0"))
            arrive = end + MS
        rows += [(r, s, base, arrive + MS) for r in range(ranks)]
    columns = ["rank", "pg", "pg_size", "op", "bytes", "dtype", "step", "issue_ns", "end_ns",
               "peer", "queue"]
    return (typed_ops(pd.DataFrame(ops, columns=columns)),
            pd.DataFrame(rows, columns=["rank", "step", "start_ns", "end_ns"]))


def speed(steps: int, ranks: int) -> None:
    ops, stepped = synthetic(steps, ranks)
    offsets = pd.DataFrame({"rank": range(ranks), "offset_ns": 0, "uncertainty_ns": 0})
    started = time.perf_counter()
    cross = cross_rank_pass(ops, stepped, offsets, ranks)
    crossed = time.perf_counter() - started
    # Every rank on one host of `ranks` CPUs, 20 ms of CPU time a step each: the what-ifs held
    # to the host's cores (what_if_cores) besides.
    cores = what_if_cores.HostCores(
        stepped.assign(cpu_ns=20.0 * MS)[["rank", "step", "cpu_ns"]],
        [((r,), 1, "host") for r in range(ranks)] + [(tuple(range(ranks)), ranks, "host")],
        [(tuple(range(ranks)), ranks)])
    timings, bounded = [], []
    for _ in range(3):
        started = time.perf_counter()
        result = critical_path.analyse(cross, stepped)
        timings.append(time.perf_counter() - started)
        started = time.perf_counter()
        critical_path.analyse(cross, stepped, cores=cores)
        bounded.append(time.perf_counter() - started)
    print(f"speed: {steps} steps x {ranks} ranks, {len(ops)} ops: cross-rank pass "
          f"{crossed:.2f} s; critical path + {len(result.what_if)} what-ifs "
          f"{statistics.median(timings):.3f} s, served on and held to the host's cores "
          f"{statistics.median(bounded):.3f} s (medians of 3)")
    # expected: the four transfers overlapped save 4 ms per step, the late rank on time 3
    for answer in result.what_if:
        print(f"  {answer['change']}: saves {answer['saved_ms_per_step']} ms per step")


# name: (workload, its fault flag, the default cost, tracer options, the what-if's kind, and
# the change it must name, "{rank}" the injected rank; None: the top answer of the kind)
EXPERIMENTS = {
    "ddp-straggle": ("workloads/ddp.py", "--straggle", "1:25", [],
                     "rank_on_time", "rank {rank} on time"),
    "ddp-straggle-tail": ("workloads/ddp.py", "--straggle-tail", "1:25", [],
                          "rank_on_time", "rank {rank} on time"),
    "pipeline-straggle": ("workloads/pipeline.py", "--straggle", "1:20", [],
                          "pipeline_bubble_theoretical", None),
    "slow-data": ("workloads/ddp.py", "--slow-data", "1:20", [], "idle_cause_removed",
                  "no data loading gaps on rank {rank}"),
    "slow-data-all": ("workloads/ddp.py", "--slow-data", "all:20", [], "idle_cause_removed",
                      "no data loading gaps on any rank"),
    "slow-data-threads": ("workloads/ddp.py", "--slow-data", "1:40", [], "idle_cause_removed",
                          "no data loading gaps on rank {rank}"),
}
# Per experiment, what its workload takes besides --steps and the cost, and its ranks' intra-op
# threads (1 otherwise).
WORKLOAD_ARGS = {"slow-data-threads": ["--hidden", "1024", "--batch-size", "256"]}
THREADS = {"slow-data-threads": 2}


def traced(out: Path, steps: int, workload: str, options: list[str],
           fault: list[str], pin: bool = False, threads: int = 1) -> Path:
    """The run folder of `workload --steps N` traced on 2 ranks, with `fault` added (the
    workload's own arguments and the cost); `pin`: each rank's process on the core of its local
    rank (taskset), the ranks sharing none; `threads`: each rank's intra-op threads."""
    rank = ["-m", "tracer.record", "--out", str(out), *options, workload, "--steps",
            str(steps), *fault]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "2"]
    if pin:
        inner = shlex.join([sys.executable, *rank])
        command = [*launcher, "--no-python", "sh", "-c", f'exec taskset -c "$LOCAL_RANK" {inner}']
    else:
        command = [*launcher, *rank]
    subprocess.run(command, cwd=REPO, env=torchrun_env(OMP_NUM_THREADS=threads), check=True,
                   capture_output=True, timeout=600)
    return next(p for p in out.iterdir() if p.is_dir())


def step_times(run_dir: Path, steps: set[int]) -> list[float]:
    """Step times (ms) of every rank's steps in `steps`, from its step records."""
    times = []
    for path in sorted(run_dir.glob("rank*.steps.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("step") in steps:
                times.append((record["end_ns"] - record["start_ns"]) / 1e6)
    return times


def matching(answers: list[dict], kind: str, change: str | None) -> dict | None:
    """The answer of `kind` (largest saving first) whose change is `change`, if given."""
    return next((a for a in answers if a["kind"] == kind
                 and (change is None or a["change"] == change)), None)


def pair(name: str, steps: int, cost: str, tmp: Path, pin: bool = False,
         active: int | None = None) -> dict:
    """One pair of runs: with the cost (its matching what-if) and without it; `active`: the
    profiled steps of the window (the tracer's --active; its default otherwise)."""
    workload, flag, _, options, kind, change = EXPERIMENTS[name]
    if active is not None:
        options = [*options, "--active", str(active)]
    args, threads = WORKLOAD_ARGS.get(name, []), THREADS.get(name, 1)
    late_dir = traced(tmp / "late", steps, workload, options, [*args, flag, cost], pin, threads)
    run = open_run(str(late_dir))
    result = run.report.critical
    # The same answers without the host's cores (their sharing and their bound), to show what
    # they changed.
    free = critical_path.analyse(run.cross_rank, idle_gaps=run.idle_gaps,
                                 profiled=run.breakdown[["rank", "step"]]).what_if
    analysed = set(int(s) for s in result.critical_path_steps["step"])
    late = step_times(late_dir, analysed)
    even = step_times(traced(tmp / "even", steps, workload, options, args, pin, threads),
                      analysed)
    change = change and change.format(rank=cost.split(":")[0])
    answer, unbounded = matching(result.what_if, kind, change), matching(free, kind, change)
    return {"steps": len(analysed), "late": statistics.mean(late),
            "measured": statistics.mean(even), "answer": answer, "answers": result.what_if,
            "unbounded": unbounded and unbounded["predicted_step_ms"]}


def accuracy(name: str, steps: int, cost: str | None, repeats: int, pin: bool = False,
             active: int | None = None) -> dict:
    """One experiment side by side, `repeats` pairs of runs; the medians over the pairs."""
    workload, flag, default, _, kind, _ = EXPERIMENTS[name]
    cost = cost or default
    print(f"accuracy ({name}): {workload} --steps {steps} {flag} {cost}, 2 ranks; per pair: "
          f"with the cost, predicted (without the host's cores: neither shared nor a bound), "
          f"measured without it (ms per step), error")
    pairs = []
    for number in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            found = pair(name, steps, cost, Path(tmp), pin, active)
        answer = found["answer"]
        if answer is None:
            print(f"  {number + 1}: {found['late']:.2f}, no {kind} answer ("
                  + "; ".join(f"{a['change']} {a['saved_ms_per_step']:.2f}"
                              for a in found["answers"][:3]) + f"), {found['measured']:.2f}")
            continue
        found["predicted"] = answer["predicted_step_ms"]
        found["error_pct"] = 100.0 * (found["predicted"] - found["measured"]) / found["measured"]
        pairs.append(found)
        held = "; held by the host's cores" if "held to it" in answer["assumptions"] else ""
        print(f"  {number + 1}: {found['late']:.2f}, {found['predicted']:.2f} "
              f"({found['unbounded']:.2f}) "
              f"({answer['change']}, {found['steps']} steps{held}), {found['measured']:.2f}, "
              f"{found['error_pct']:+.1f}%")
    if not pairs:
        return {"experiment": name, "predicted": None, "measured": None}
    predicted = statistics.median(p["predicted"] for p in pairs)
    measured = statistics.median(p["measured"] for p in pairs)
    error = 100.0 * (predicted - measured) / measured
    unbounded = statistics.median(p["unbounded"] for p in pairs)
    print(f"  median of {len(pairs)}: predicted {predicted:.2f}, measured {measured:.2f}, "
          f"error {error:+.1f}% (without the host's cores: predicted {unbounded:.2f}, "
          f"{100.0 * (unbounded - measured) / measured:+.1f}%; aim: within +-10%)")
    return {"experiment": name, "predicted": predicted, "measured": measured,
            "error_pct": error}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--active", type=int, default=20,
                        help="profiled steps of the window (the tracer's --active, whose own "
                             "default is 3): an idle-gap answer's saving is the mean over the "
                             "profiled steps, and 3 steps of a shared machine's step-to-step "
                             "noise would be measured instead of the model")
    parser.add_argument("--experiment", nargs="+", choices=sorted(EXPERIMENTS),
                        default=["ddp-straggle"])
    parser.add_argument("--cost", metavar="RANK:MS",
                        help="the injected cost (default: each experiment's own)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="pairs of runs per experiment; the medians over them are compared")
    parser.add_argument("--pin-ranks", action="store_true",
                        help="each rank on a core of its own (taskset), where the ranks would "
                             "otherwise share the machine's cores (Linux)")
    parser.add_argument("--speed-only", action="store_true")
    parser.add_argument("--speed-steps", type=int, default=1000)
    parser.add_argument("--speed-ranks", type=int, default=8)
    args = parser.parse_args()
    speed(args.speed_steps, args.speed_ranks)
    if not args.speed_only:
        results = [accuracy(name, args.steps, args.cost, args.repeats, args.pin_ranks,
                            args.active) for name in args.experiment]
        print("summary: experiment, predicted ms, measured ms, error % (medians over pairs)")
        for row in results:
            if row["predicted"] is None:
                print(f"  {row['experiment']}: no answer")
                continue
            print(f"  {row['experiment']}, {row['predicted']:.2f}, {row['measured']:.2f}, "
                  f"{row['error_pct']:+.1f}")


if __name__ == "__main__":
    main()
