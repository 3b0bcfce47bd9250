"""The tracer's options: one dataclass, its command line and its RANKTRACE_* environment variables.

Every field is an option `--field-name` and an environment variable `RANKTRACE_FIELD_NAME`
(the same name, upper case); the command line wins over the environment, the environment over
the default. Booleans are two flags on the command line, `--field` and `--no-field` (a field
named no_thing: `--no-thing` and `--thing`), and 1/0, true/false, yes/no, on/off in the
environment. Unknown options and unknown RANKTRACE_* variables are errors, so a typo never
silently falls back to a default; the analysis's own variables (tracer.options.environment) are
let through. The command line is parsed by argparse, with the script and
its arguments as one REMAINDER, as torchrun does.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from tracer.options import help_format
from tracer.options.environment import ANALYSIS_VARIABLES, PREFIX

ENV_PREFIX = PREFIX
PROG = "python -m tracer.record"
USAGE = "{prog} [tracer options] SCRIPT [script args]"
# Old spellings of renamed options, still taken with a warning: option -> new option.
RENAMED = {"--repeat": "--windows"}
RENAMED_ENV = {PREFIX + "REPEAT": PREFIX + "WINDOWS"}
# The --help's groups: a field -> its group's title (the fields not listed: "the run").
GROUPS = {
    **dict.fromkeys(("skip_first", "wait", "warmup", "active", "windows", "record_shapes",
                     "profile_memory", "with_stack", "no_profiler"), "the profiler"),
    **dict.fromkeys(("capture_slow_steps", "max_captures", "no_capture"),
                    "capture on slow steps"),
    **dict.fromkeys(("max_window_steps", "max_window_s", "max_window_mb"), "window bounds"),
    **dict.fromkeys(("sample_hz", "no_sampler", "memory_snapshot", "peak_tflops"),
                    "device and memory"),
    **dict.fromkeys(("no_comms", "ddp_bucket_hook", "no_issue_records", "no_flight_recorder"),
                    "collectives"),
    **dict.fromkeys(("no_scalars", "samples_per_step", "max_record_mb"), "records"),
}


class ConfigError(ValueError):
    """A bad option or environment variable; the message names it."""


@dataclass(frozen=True)
class TracerConfig:
    """The tracer's options, one line each (the --help text and docs/tracer.md's table):

    out: folder that receives one run folder per run; created with its parents if missing
    run_name: run folder name (default: <YYYYmmdd-HHMMSS>-<script stem>); a suffix -1, -2...
        is added if it exists
    skip_first: profiler: steps to ignore before the first window (start-up, first DDP bucket
        rebuild)
    wait: profiler: idle steps at the start of each window cycle
    warmup: profiler: steps recorded but discarded before each active span
    active: profiler: steps kept in each trace file
    windows: profiler: number of windows (0: keep cycling until the script ends; --repeat, the
        old name, is still taken)
    record_shapes: profiler: record operator input shapes (the FLOP counts of
        analysis.rank.flops need them)
    profile_memory: profiler: record tensor allocations and frees, with the Python stacks that
        torch's memory profiler needs to sort them into categories at each window's peak
    with_stack: profiler: record Python stacks of operators (large traces)
    sample_hz: device/process samples per second
    memory_snapshot: CUDA: record allocator history and dump a memory snapshot at the end
        (one is always dumped on out-of-memory)
    no_profiler: do not run torch.profiler (no Kineto traces)
    no_sampler: do not sample devices/process (no samples file)
    no_comms: do not hook collectives and p2p ops (no comms file)
    no_scalars: do not write TensorBoard scalars (no event file; about half of the step-end
        worker's CPU)
    ddp_bucket_hook: comms: time each DDP gradient bucket through a comm hook that reduces as
        DDP does
    no_issue_records: comms: do not write each op's record when it is issued (no issued
        file); a stop is then diagnosed from completion records and traces only
    no_flight_recorder: comms: do not read torch's Flight Recorder, so the ops torch's C++
        code issues (DDP's gradient buckets) are missing outside the profiler's windows
    samples_per_step: samples the whole job trains per step (the global batch), stored in each
        step record; tracer.set_samples_per_step() in the script overrides it (0: not recorded)
    rendezvous_timeout: seconds a rank waits for rank 0 to name the run folder before giving up
    max_record_mb: stop a rank's step, comm, sample records and scalars past this many MB in
        all (0: no cap)
    peak_tflops: the device's peak TFLOP/s for MFU, recorded in run_start (0: measured by a
        short matmul on CPU before the script starts, the datasheet's on GPUs)
    capture_slow_steps: when a rank's steps turn at least this many times slower than its
        running median, beyond its noise, and stay so, every rank profiles the same later steps
        (given alone: 2; 0: off)
    no_capture: no profiler window off the fixed schedule: no slow-step watch, no answer to
        python -m tracer.capture
    max_captures: slow-step windows per run at most; the last is kept for a change larger than
        any captured before it
    max_window_steps: steps any window traces at most: --active above it is refused, a longer
        ask is clipped to it
    max_window_s: a window still open after this many seconds is closed and written at the next
        step end (0: no limit)
    max_window_mb: a window in which the process's resident memory grew by this many MB is
        closed and written at the next step end (Linux; 0: no limit)
    """

    out: str = "traces/"
    run_name: str = ""
    skip_first: int = 5
    wait: int = 1
    warmup: int = 1
    active: int = 3
    windows: int = 1
    record_shapes: bool = True
    profile_memory: bool = False
    with_stack: bool = False
    sample_hz: float = 10.0
    memory_snapshot: bool = False
    no_profiler: bool = False
    no_sampler: bool = False
    no_comms: bool = False
    no_scalars: bool = False
    ddp_bucket_hook: bool = False
    no_issue_records: bool = False
    no_flight_recorder: bool = False
    samples_per_step: int = 0
    rendezvous_timeout: float = 300.0
    max_record_mb: float = 0.0
    peak_tflops: float = 0.0
    capture_slow_steps: float = 2.0
    no_capture: bool = False
    max_captures: int = 3
    max_window_steps: int = 20
    max_window_s: float = 30.0
    max_window_mb: float = 1024.0

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            kind = _field_type(f)
            # bool is an int subclass; reject it where a count is expected and vice versa.
            if kind is bool and not isinstance(value, bool):
                raise ConfigError(f"{option_name(f.name)} must be a boolean, got {value!r}")
            if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"{option_name(f.name)} must be an integer, got {value!r}")
            if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ConfigError(f"{option_name(f.name)} must be a number, got {value!r}")
            if kind is str and not isinstance(value, str):
                raise ConfigError(f"{option_name(f.name)} must be a string, got {value!r}")
        if not self.out:
            raise ConfigError("--out must not be empty")
        if self.run_name and (self.run_name in (".", "..") or "/" in self.run_name
                              or os.sep in self.run_name or self.run_name.startswith("-")):
            raise ConfigError(f"--run-name must be a plain folder name, got {self.run_name!r}")
        for name in ("skip_first", "wait", "warmup", "windows", "samples_per_step"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{option_name(name)} must be >= 0, got {getattr(self, name)}")
        if self.active < 1:
            raise ConfigError(f"--active must be >= 1, got {self.active}")
        if not 0 < self.sample_hz <= 1000:
            raise ConfigError(f"--sample-hz must be in (0, 1000], got {self.sample_hz}")
        if not 0 <= self.peak_tflops < float("inf"):
            raise ConfigError(f"--peak-tflops must be >= 0, got {self.peak_tflops}")
        if not self.max_record_mb >= 0:
            raise ConfigError(f"--max-record-mb must be >= 0, got {self.max_record_mb}")
        if not (self.capture_slow_steps == 0 or self.capture_slow_steps > 1):
            raise ConfigError(f"--capture-slow-steps must be > 1 (or 0: off), got "
                              f"{self.capture_slow_steps}")
        if self.max_captures < 0:
            raise ConfigError(f"--max-captures must be >= 0, got {self.max_captures}")
        if self.max_window_steps < 1:
            raise ConfigError(f"--max-window-steps must be >= 1, got {self.max_window_steps}")
        if self.active > self.max_window_steps:
            raise ConfigError(f"--active {self.active} is above --max-window-steps "
                              f"{self.max_window_steps}: a window holds every event of its "
                              f"steps in memory until it ends; raise --max-window-steps to "
                              f"trace that many")
        for name in ("max_window_s", "max_window_mb"):
            if not 0 <= getattr(self, name) < float("inf"):
                raise ConfigError(f"{option_name(name)} must be >= 0 (0: no limit), got "
                                  f"{getattr(self, name)}")
        if not self.rendezvous_timeout > 0:
            raise ConfigError(f"--rendezvous-timeout must be > 0, got {self.rendezvous_timeout}")


def _field_type(f: dataclasses.Field) -> type:
    # With `from __future__ import annotations` the annotation is the string "int", "bool"...
    return {"bool": bool, "int": int, "float": float, "str": str}[str(f.type)]


def option_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


# A boolean field named no_<thing> (no_profiler) is an off switch: `--no-thing` sets it, and
# `--thing` is its opposite (never `--no-no-thing`).
_OFF_SWITCH = "no_"


def switch_options(field_name: str) -> tuple[str, str]:
    """A boolean field's two options: (the one that sets it, the one that clears it)."""
    if field_name.startswith(_OFF_SWITCH):
        return option_name(field_name), option_name(field_name[len(_OFF_SWITCH):])
    return option_name(field_name), "--no-" + field_name.replace("_", "-")


class _OffSwitchAction(argparse.BooleanOptionalAction):
    """BooleanOptionalAction for a field named no_<thing>, given `--thing`: `--no-thing` sets
    the field True, `--thing` sets it False; --help lists `--no-thing` first."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.option_strings = self.option_strings[::-1]

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string in self.option_strings:
            setattr(namespace, self.dest, option_string.startswith("--no-"))


# In TracerConfig's docstring: "name: help" at the left margin, continued on indented lines.
# Options whose value may be left out: the value they then take.
_OPTIONAL_VALUE = {"capture_slow_steps": 2.0}
_HELP_ENTRY = re.compile(r"^(?P<name>[a-z_]+): (?P<help>.+(?:\n[ \t]+.+)*)", re.M)


@lru_cache(maxsize=1)
def field_help() -> dict[str, str]:
    """Field name -> its entry in TracerConfig's docstring ("" under python -OO)."""
    doc = inspect.cleandoc(TracerConfig.__doc__ or "")
    helps = {m["name"]: " ".join(m["help"].split()) for m in _HELP_ENTRY.finditer(doc)}
    return {f.name: helps.get(f.name, "") for f in dataclasses.fields(TracerConfig)}


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_KIND_WORDS = {int: "an integer", float: "a number", str: "a string"}


def _convert(kind: type, text: str, where: str):
    if kind is bool:
        lowered = text.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ConfigError(f"{where} must be one of 1/0, true/false, yes/no, on/off; got {text!r}")
    try:
        return kind(text)
    except ValueError:
        raise ConfigError(f"{where} must be {_KIND_WORDS[kind]}, got {text!r}") from None


def from_env(environ: Mapping[str, str]) -> dict:
    """The RANKTRACE_* variables as field values; the analysis's are let through, an old name
    (RENAMED_ENV) is taken with a warning, any other unknown one is an error."""
    fields = {env_name(f.name): f for f in dataclasses.fields(TracerConfig)}
    values = {}
    for key, text in environ.items():
        if not key.startswith(ENV_PREFIX) or key in ANALYSIS_VARIABLES:
            continue
        if key in RENAMED_ENV:
            print(f"ranktrace: warning: {key} is deprecated; use {RENAMED_ENV[key]}",
                  file=sys.stderr)
            key = RENAMED_ENV[key]
        f = fields.get(key)
        if f is None:
            known = ", ".join(sorted(fields))
            raise ConfigError(f"unknown environment variable {key} (known: {known}; the "
                              f"analysis's: {', '.join(ANALYSIS_VARIABLES)})")
        values[f.name] = _convert(_field_type(f), text, key)
    return values


class _Parser(argparse.ArgumentParser):
    """Errors are raised as ConfigError, for the caller to report (and for tests to catch)."""

    def error(self, message: str):
        raise ConfigError(message)


def _option_type(kind: type, option: str):
    def convert(text: str):
        try:
            return _convert(kind, text, option)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = kind.__name__
    return convert


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The command line: tracer options, then SCRIPT and everything after it, untouched.

    Options left out stay out of the namespace (default SUPPRESS), so that the environment and
    the dataclass fill them in."""
    parser = _Parser(
        prog=prog, usage=USAGE.format(prog=prog), allow_abbrev=False,
        formatter_class=help_format.HelpFormatter,
        description="Runs SCRIPT as __main__ under the ranktrace tracer (also under torchrun: "
                    "torchrun --nproc-per-node N --no-python ranktrace record [tracer options] "
                    "SCRIPT [args], or torchrun ... -m tracer.record ...). Tracer options go "
                    "before SCRIPT; everything after SCRIPT is the script's. Each option can "
                    "also be set by the environment variable shown.")
    helps = field_help()
    groups = {title: parser.add_argument_group(title)
              for title in ["the run", *dict.fromkeys(GROUPS.values())]}
    for f in dataclasses.fields(TracerConfig):
        group = groups[GROUPS.get(f.name, "the run")]
        kind, option = _field_type(f), option_name(f.name)
        if kind is bool:
            sets, clears = switch_options(f.name)
            off_switch = f.name.startswith(_OFF_SWITCH)
            default = f" (default: {'on' if f.default else 'off'})"
            group.add_argument(clears if off_switch else sets, dest=f.name,
                                action=_OffSwitchAction if off_switch
                                else argparse.BooleanOptionalAction,
                                default=argparse.SUPPRESS,
                                help=f"{helps[f.name]}{default} [{env_name(f.name)}]")
        else:
            default = f" (default: {f.default})" if f.default != "" else ""
            optional = ({"nargs": "?", "const": _OPTIONAL_VALUE[f.name]}
                        if f.name in _OPTIONAL_VALUE else {})
            group.add_argument(option, type=_option_type(kind, option), metavar=f.name.upper(),
                                default=argparse.SUPPRESS, **optional,
                                help=f"{helps[f.name]}{default} [{env_name(f.name)}]")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="SCRIPT [script args]",
                        help="the training script and its own arguments")
    return parser


def option_arities() -> dict[str, int | str]:
    """Each option string of the command line (both forms of a boolean) -> 0 for a flag, 1 for
    an option with a value, "?" for one whose value may be left out (_OPTIONAL_VALUE)."""
    actions = build_parser()._option_string_actions
    arities = {string: 1 if action.nargs is None else action.nargs
               for string, action in actions.items() if action.dest != "help"}
    return {**arities, **{old: arities[new] for old, new in RENAMED.items()}}


def _optional_values(argv: list[str]) -> list[str]:
    """`argv` with each option of _OPTIONAL_VALUE given without a number written
    `--option=VALUE` (argparse's nargs="?" would take the script's name as its value), and
    each old spelling of RENAMED written as the new one, with a warning."""
    takes_value = {option_name(f.name) for f in dataclasses.fields(TracerConfig)
                   if _field_type(f) is not bool}
    optional = {option_name(name): value for name, value in _OPTIONAL_VALUE.items()}
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--" or not arg.startswith("-"):
            return out + argv[i:]  # the script and its own arguments, untouched
        name, equals, value = arg.partition("=")
        if name in RENAMED:
            print(f"ranktrace: warning: {name} is deprecated; use {RENAMED[name]}",
                  file=sys.stderr)
            arg = RENAMED[name] + equals + value
        if arg in optional:
            following = argv[i + 1] if i + 1 < len(argv) else ""
            try:
                float(following)
            except ValueError:
                out.append(f"{arg}={optional[arg]}")
                i += 1
                continue
        out.append(arg)
        if arg in takes_value and i + 1 < len(argv):
            out.append(argv[i + 1])
            i += 1
        i += 1
    return out


def resolve(argv: Sequence[str], environ: Mapping[str, str] | None = None, prog: str = PROG
            ) -> tuple[TracerConfig, str, list[str]]:
    """(config, script, script args) from the command line and the environment.

    `--help` prints the help and raises SystemExit(0), as argparse does; every other problem
    raises ConfigError."""
    environ = os.environ if environ is None else environ
    namespace = vars(build_parser(prog).parse_args(_optional_values(list(argv))))
    command = namespace.pop("command")
    if command[:1] == ["--"]:  # `--` ends the tracer's options; the script comes after it
        command = command[1:]
    values = from_env(environ)
    values.update(namespace)
    config = TracerConfig(**values)
    if not command:
        raise ConfigError(f"no script given; usage: {USAGE.format(prog=prog)}")
    return config, command[0], command[1:]
