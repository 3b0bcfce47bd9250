"""What finding a run's phases costs (analysis.crossrank.phases), against the cross-rank pass and
critical path it stands on.

    python benchmarks/phases_cost.py [--steps 2100] [--repeat 5]

1. A synthetic 2-rank run of --steps steps with one all_reduce a step, rank 1 late by 60 ms in
   its last 100 (tests/helpers/phase_runs.py): the cross-rank pass and critical path
   (`crossrank.analyse` + `critical_path.analyse`) and the phases (`find_phases`, each phase's
   straggler rule and what-if), timed side by side, round after round; prints each one's median
   CPU seconds with the spread (min-max), and the ratio phases / (cross-rank + path).
2. The change-point search alone on per-step frames of many ranks (256 ranks x 2,000 steps,
   2 ranks x 20,000 steps): median CPU seconds with the spread.
CPU time, which other work on the machine disturbs less than wall time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from analysis.crossrank.phases import find_phases  # noqa: E402
from helpers.phase_runs import analysed, synthetic_inputs, synthetic_run  # noqa: E402

SLOW_STEPS = 100


def _cpu(function) -> tuple[float, object]:
    started = time.process_time()
    result = function()
    return time.process_time() - started, result


def _frame(ranks: int, steps: int) -> pd.DataFrame:
    """1 ms steps with noise; rank 1 late by 60 ms in the last SLOW_STEPS."""
    rng = np.random.default_rng(0)
    step = np.repeat(np.arange(1, steps + 1), ranks)
    rank = np.tile(np.arange(ranks), steps)
    slow = step > steps - SLOW_STEPS
    step_ms = 1.0 + np.abs(rng.normal(0, 0.05, len(step))) + np.where(slow, 60.0, 0.0)
    wait_ms = np.where(slow & (rank != 1), 60.0, 0.0) + np.abs(rng.normal(0, 0.01, len(step)))
    return pd.DataFrame({"rank": rank, "step": step, "step_ns": step_ms * 1e6,
                         "peer_wait_ns": wait_ms * 1e6})


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} s (spread {min(values):.3f}-{max(values):.3f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2100)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    slow_from = args.steps - SLOW_STEPS + 1
    rows, cross, path = synthetic_run(args.steps, slow_from)
    inputs = synthetic_inputs(args.steps, slow_from)
    find_phases(rows, cross, path)  # imports (ruptures) out of the timing
    base, phases, found = [], [], None
    for _ in range(args.repeat):
        seconds, _ = _cpu(lambda: analysed(*inputs))
        base.append(seconds)
        seconds, found = _cpu(lambda: find_phases(rows, cross, path))
        phases.append(seconds)
    ratio = statistics.median(phases) / statistics.median(base)
    print(f"2 ranks x {args.steps} steps: cross-rank pass + critical path {_spread(base)}; "
          f"phases {_spread(phases)}; ratio {ratio:.3f}; phases from steps "
          f"{[p.first_step for p in found]}")
    for ranks, steps in ((256, 2000), (2, 20000)):
        frame = _frame(ranks, steps)
        times = []
        for _ in range(args.repeat):
            seconds, found = _cpu(lambda frame=frame: find_phases(frame))
            times.append(seconds)
        print(f"{ranks} ranks x {steps} steps, per-step rows alone: phases {_spread(times)}; "
              f"from steps {[p.first_step for p in found]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
