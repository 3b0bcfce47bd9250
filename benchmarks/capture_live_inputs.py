"""A running job's live inputs, one at a time (issue 45's cases): a 2-rank DDP job of fast steps
(tests/scripts/slow_from.py, 1 ms of work a step) gets, at about step 300, an ask of 10^9 steps,
4 KB of random bytes as an ask, or a request for steps -10^12..10^11 in torchrun's store; each
traced run is compared with the untraced one.

    .venv/bin/python benchmarks/capture_live_inputs.py [--steps 3000] [--cases ...]
        [--checkout PATH]

For each case prints: exit code, seconds against the untraced run's and the bound (3 x untraced
+ 20 s), whether the losses equal the untraced run's, each rank's step records against the
steps run, the capture records and the problem lines. `--checkout` runs another checkout's
tracer (say `git worktree add /tmp/old COMMIT`) on the same cases, the way they were measured
before the bounds.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = str(REPO / "tests" / "scripts" / "slow_from.py")
RUN_ID = "live-inputs"
INJECT_AT = 300  # the step after which the input is written
CASES = ("ask-1e9", "ask-random", "request-far")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(checkout: Path) -> dict:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("RANKTRACE_")},
            "PYTHONPATH": f"{checkout}{os.pathsep}{REPO}", "OMP_NUM_THREADS": "1",
            "CUDA_VISIBLE_DEVICES": "", "GLOO_SOCKET_IFNAME": "lo"}


def command(port: int, steps: int, losses: Path, out: Path | None) -> list[str]:
    head = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
            "--master-addr=127.0.0.1", f"--master-port={port}", f"--rdzv-id={RUN_ID}"]
    tracer = ["-m", "tracer.record", "--out", str(out), "--run-name", "run"] if out else []
    return [*head, *tracer, SCRIPT, "--steps", str(steps), "--step-ms", "1", "--losses",
            str(losses)]


def steps_written(run_dir: Path) -> int:
    """Step records on disk for rank 0 so far (its file is flushed every second)."""
    for name in ("rank0.steps.jsonl", "rank0.steps.jsonl.tmp"):
        path = run_dir / name
        if path.exists():
            return path.read_bytes().count(b"\n")
    return 0


def inject(case: str, run_dir: Path, port: int) -> None:
    from tracer import schema

    if case == "ask-1e9":
        record = {"steps": 10**9, "t_ns": time.time_ns()}
        (run_dir / "capture.ask0.jsonl").write_bytes(json.dumps(record).encode() + b"\n")
    elif case == "ask-random":
        (run_dir / "capture.ask0.jsonl").write_bytes(os.urandom(4096))
    else:
        import torch.distributed as dist

        store = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False)
        prefix = f"ranktrace/capture/{RUN_ID}/attempt0"
        request = {"trigger": "on_demand", "trigger_step": INJECT_AT, "first_step": -10**12,
                   "steps": 10**11, "t_ns": time.time_ns(), "run": run_dir.name}
        index = int(store.add(f"{prefix}/count", 1)) - 1
        store.set(f"{prefix}/{index}", json.dumps(request).encode())
        # The same request in the run folder's list, for a tracer that reads files.
        (run_dir / schema.CAPTURE_REQUEST_FILE.format(index=0)).write_bytes(
            json.dumps(request).encode())


def run_case(case: str | None, steps: int, checkout: Path, folder: Path) -> dict:
    port, losses = free_port(), folder / f"{case or 'untraced'}.losses"
    out = folder / f"{case}" if case else None
    started = time.monotonic()
    process = subprocess.Popen(command(port, steps, losses, out), cwd=checkout,
                               env=env(checkout), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    if case:
        run_dir = out / "run"
        while steps_written(run_dir) < INJECT_AT and process.poll() is None:
            time.sleep(0.05)
        inject(case, run_dir, port)
    _, stderr = process.communicate(timeout=3600)
    result = {"case": case or "untraced", "exit": process.returncode,
              "seconds": round(time.monotonic() - started, 1), "losses": losses}
    if case:
        run_dir = out / "run"
        result["step_records"] = [steps_written_of(run_dir, rank) for rank in (0, 1)]
        result["captures"] = manifest_lines(run_dir, '"kind":"capture"')
        result["lines"] = [line for line in stderr.splitlines()
                           if line.startswith("ranktrace:") and " ok steps=" not in line]
    return result


def steps_written_of(run_dir: Path, rank: int) -> int:
    for name in (f"rank{rank}.steps.jsonl", f"rank{rank}.steps.jsonl.tmp"):
        path = run_dir / name
        if path.exists():
            return path.read_bytes().count(b"\n")
    return 0


def manifest_lines(run_dir: Path, kind: str) -> list[str]:
    found = []
    for path in sorted(run_dir.glob("rank*.manifest.jsonl*")):
        found += [line[:160] for line in path.read_text().splitlines() if kind in line]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--cases", nargs="+", choices=CASES, default=CASES)
    parser.add_argument("--checkout", type=Path, default=REPO,
                        help="the checkout whose tracer runs (default: this one)")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; {args.steps} steps; tracer of "
          f"{args.checkout}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        bare = run_case(None, args.steps, args.checkout, folder)
        bound = 3 * bare["seconds"] + 20
        print(f"untraced: exit {bare['exit']}, {bare['seconds']} s (bound {bound:.1f} s)")
        reference = bare["losses"].read_text()
        for case in args.cases:
            result = run_case(case, args.steps, args.checkout, folder)
            same = result["losses"].exists() and result["losses"].read_text() == reference
            print(f"{case}: exit {result['exit']}, {result['seconds']} s "
                  f"({'within' if result['seconds'] <= bound else 'PAST'} the bound), losses "
                  f"{'equal' if same else 'DIFFER'}, step records {result['step_records']} of "
                  f"{args.steps}")
            for line in result["captures"] + result["lines"]:
                print(f"    {line}")


if __name__ == "__main__":
    main()
