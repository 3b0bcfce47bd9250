"""A scaling sweep: one traced torchrun launch per world size (and repeat) into one sweep folder,
then the scaling study of them all (docs/scaling.md).

    python -m tracer.sweep --nproc 1,2,4 [--nnodes 1,2] [--repeats K] [--out SWEEP]
                           [tracer options] script.py [script args]

Sweep options and tracer options (docs/tracer.md) go before the script, in any order; every
word after the script is the script's. Each launch is `torchrun --nproc-per-node N -m
tracer.record --out SWEEP --run-name ws{W}-n{nodes}-r{K} [tracer options] script.py [args]`; its
output goes to `SWEEP/ws{W}-n{nodes}-r{K}.log`, and `SWEEP/sweep.jsonl` lists every launch.
The scaling study (analysis.scaling) then runs in this process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from analysis import scaling
from tracer.options import help_format
from tracer.options.config import ConfigError, option_arities, resolve

# Tracer options the sweep sets itself.
OWNED_TRACER_OPTIONS = ("--out", "--run-name")
SWEEP_FILE = "sweep.jsonl"


def int_list(text: str) -> list[int]:
    try:
        values = [int(word) for word in text.split(",") if word.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers, got "
                                         f"{text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


PROG = "python -m tracer.sweep"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = help_format.parser(
        prog, "Trace SCRIPT under torchrun once per world size and repeat, into one sweep "
              "folder, then compare the runs (ranktrace scaling). Tracer options: ranktrace "
              "record --help.",
        usage=f"{prog} --nproc 1,2,4 [sweep options] [tracer options] SCRIPT [script args]")
    launches = parser.add_argument_group("the launches")
    launches.add_argument("--nproc", type=int_list, required=True, metavar="N[,N...]",
                          help="processes per node, one launch per value (required)")
    launches.add_argument("--nnodes", type=int_list, default=[1], metavar="M[,M...]",
                          help="nodes, one launch per value and --nproc value; with more than "
                               "one node run the same command on every node with its "
                               "--node-rank")
    launches.add_argument("--node-rank", type=int, default=0, help="this node's rank")
    launches.add_argument("--master-addr", default="127.0.0.1",
                          help="node 0's address, for launches over several nodes")
    launches.add_argument("--master-port", type=int, default=29500,
                          help="node 0's port, for launches over several nodes")
    launches.add_argument("--repeats", type=int, default=1, metavar="K",
                          help="launches per world size, so that the report shows the spread")
    launches.add_argument("--run-timeout", type=float, default=None, metavar="S",
                          help="end a launch that runs longer than S seconds (default: never)")
    launches.add_argument("--out", type=Path, metavar="SWEEP",
                          help="sweep folder (default: traces/sweep-<YYYYmmdd-HHMMSS>-<script>)")
    analysis = parser.add_argument_group("the scaling analysis (ranktrace scaling)")
    scaling.add_study_options(analysis)
    analysis.add_argument("--format", choices=["text", "json", "csv"], default="text",
                          help="standard output of the scaling report")
    return parser


def split_words(parser: argparse.ArgumentParser, argv: list[str]
                ) -> tuple[list[str], list[str], list[str]]:
    """(sweep words, tracer words, SCRIPT and its args): options are taken up to the first word
    that is neither a sweep nor a tracer option nor an option's value."""
    sweep_takes = {s: a.nargs != 0 for s, a in parser._option_string_actions.items()}
    # both forms of a tracer boolean (--record-shapes, --no-record-shapes) are flags; an option
    # whose number may be left out (--capture-slow-steps) takes the next word only if a number
    tracer_takes = option_arities()
    sweep, tracer, i = [], [], 0
    while i < len(argv):
        name = argv[i].partition("=")[0]
        if name in sweep_takes:
            target, takes = sweep, sweep_takes[name]
        elif name in tracer_takes:
            target, takes = tracer, tracer_takes[name]
            if takes == "?":
                takes = i + 1 < len(argv) and _is_number(argv[i + 1])
        else:
            break
        target.append(argv[i])
        if takes and "=" not in argv[i] and i + 1 < len(argv):
            i += 1
            target.append(argv[i])
        i += 1
    return sweep, tracer, argv[i:]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def launches(args) -> list[dict]:
    """Every launch of the sweep on this node, smallest world size first."""
    plan = []
    for nnodes in sorted(set(args.nnodes)):
        for nproc in sorted(set(args.nproc)):
            if args.node_rank >= nnodes:
                continue  # this node takes no part in a launch over fewer nodes
            for repeat in range(args.repeats):
                world = nnodes * nproc
                plan.append({"name": f"ws{world}-n{nnodes}-r{repeat}", "world_size": world,
                             "nnodes": nnodes, "nproc": nproc, "repeat": repeat})
    return sorted(plan, key=lambda p: (p["world_size"], p["nnodes"], p["repeat"]))


def torchrun_command(launch: dict, args, sweep_dir: Path, tracer_words: list[str],
                     script: list[str]) -> list[str]:
    command = [sys.executable, "-m", "torch.distributed.run",
               f"--nproc-per-node={launch['nproc']}"]
    if launch["nnodes"] == 1:
        command.append("--standalone")
    else:
        command += [f"--nnodes={launch['nnodes']}", f"--node-rank={args.node_rank}",
                    f"--master-addr={args.master_addr}", f"--master-port={args.master_port}"]
    return command + ["-m", "tracer.record", "--out", str(sweep_dir), "--run-name",
                      launch["name"], *tracer_words, *script]


def _child_env() -> dict:
    """The environment of the launches, whose `-m tracer.record` imports from this checkout
    wherever the sweep was started."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def run_launch(command: list[str], log: Path, timeout: float | None) -> tuple[int, float]:
    """Run one launch with its output in `log`; (exit code, seconds). A timeout is exit 124."""
    env = _child_env()
    started = time.monotonic()
    with log.open("w") as out:
        try:
            code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                  timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = 124
    return code, time.monotonic() - started


def run_scaling_report(argv: list[str]) -> int:
    """`python -m analysis.scaling ARGV`, in this process, on its stdout and stderr; its exit
    code."""
    try:
        code = scaling.main(argv)
    except SystemExit as exc:  # argparse's exit, as the command would have exited
        code = exc.code if isinstance(exc.code, int) else 1
    if code == 0:
        return 0
    print(f"ranktrace sweep: the scaling report (python -m analysis.scaling {' '.join(argv)}) "
          f"exited with {code}", file=sys.stderr)
    return code


def analysis_argv(args, sweep_dir: Path) -> list[str]:
    argv = [str(sweep_dir), "--format", args.format]
    for option, value in (("--mode", args.mode), ("--samples-per-step", args.samples_per_step),
                          ("--warmup-steps", args.warmup_steps)):
        if value is not None:
            argv += [option, str(value)]
    return argv


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(prog)
    sweep_words, tracer_words, script = split_words(parser, argv)
    if any(w in ("-h", "--help") for w in sweep_words) or not script:
        parser.parse_args(sweep_words + (["--help"] if not script else []))
    args = parser.parse_args(sweep_words)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    try:
        resolve(tracer_words + script, {})
    except ConfigError as exc:
        parser.error(f"tracer option: {exc}")
    owned = [w for w in tracer_words if w.partition("=")[0] in OWNED_TRACER_OPTIONS]
    if owned:
        parser.error(f"{owned[0]} is set by the sweep for each launch; give the sweep folder "
                     f"with the sweep's --out")
    sweep_dir = args.out or Path("traces") / (
        f"sweep-{time.strftime('%Y%m%d-%H%M%S')}-{Path(script[0]).stem}")
    sweep_dir.mkdir(parents=True, exist_ok=True)
    failed = []
    plan = launches(args)
    for number, launch in enumerate(plan, start=1):
        command = torchrun_command(launch, args, sweep_dir, tracer_words, script)
        log = sweep_dir / f"{launch['name']}.log"
        code, seconds = run_launch(command, log, args.run_timeout)
        state = "ok" if code == 0 else f"exit code {code}"
        print(f"ranktrace sweep: [{number}/{len(plan)}] {launch['world_size']} ranks "
              f"({launch['nnodes']} node(s) x {launch['nproc']}), repeat {launch['repeat'] + 1}: "
              f"{state} in {seconds:.1f} s -> {log}", file=sys.stderr, flush=True)
        if code != 0:
            failed.append(launch["name"])
        with (sweep_dir / SWEEP_FILE).open("a") as index:
            index.write(json.dumps({**launch, "command": command, "exit_code": code,
                                    "seconds": round(seconds, 3)}) + "\n")
    if args.node_rank != 0:
        return 1 if failed else 0
    if len(failed) == len(plan):
        print(f"ranktrace sweep: every launch failed; see the logs in {sweep_dir}",
              file=sys.stderr)
        return 1
    code = run_scaling_report(analysis_argv(args, sweep_dir))
    if failed:
        print(f"ranktrace sweep: {len(failed)} launch(es) failed ({', '.join(failed)}); the "
              f"report leaves out what they did not write", file=sys.stderr)
    return 1 if failed else code


if __name__ == "__main__":
    sys.exit(main())
