"""The tracer's options: one dataclass, its command line and its RANKTRACE_* environment variables.

Every field is an option `--field-name` and an environment variable `RANKTRACE_FIELD_NAME`
(the same name, upper case); the command line wins over the environment, the environment over
the default. Booleans are flags on the command line and 1/0, true/false, yes/no, on/off in the
environment. Unknown options and unknown RANKTRACE_* variables are errors, so a typo never
silently falls back to a default. The string after each field is its help text (`--help`,
`docs/tracer.md`).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import sys
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Sequence

ENV_PREFIX = "RANKTRACE_"


class ConfigError(ValueError):
    """A bad option or environment variable; the message names it."""


@dataclass(frozen=True)
class TracerConfig:
    out: str = "traces/"
    """folder that receives one run folder per run; created with its parents if missing"""
    run_name: str = ""
    """run folder name (default: <YYYYmmdd-HHMMSS>-<script stem>); a suffix -1, -2... is added if it exists"""
    skip_first: int = 5
    """profiler: steps to ignore before the first window (start-up, first DDP bucket rebuild)"""
    wait: int = 1
    """profiler: idle steps at the start of each window cycle"""
    warmup: int = 1
    """profiler: steps recorded but discarded before each active span"""
    active: int = 3
    """profiler: steps kept in each trace file"""
    repeat: int = 1
    """profiler: number of windows (0: keep cycling until the script ends)"""
    record_shapes: bool = False
    """profiler: record operator input shapes"""
    profile_memory: bool = False
    """profiler: record tensor allocations and frees"""
    with_stack: bool = False
    """profiler: record Python stacks of operators (large traces)"""
    sample_hz: float = 10.0
    """device/process samples per second"""
    memory_snapshot: bool = False
    """CUDA: record allocator history and dump a memory snapshot at the end (one is always dumped on out-of-memory)"""
    no_profiler: bool = False
    """do not run torch.profiler (no Kineto traces)"""
    no_sampler: bool = False
    """do not sample devices/process (no samples file)"""
    no_comms: bool = False
    """do not hook collectives and p2p ops (no comms file)"""
    ddp_bucket_hook: bool = False
    """comms: time each DDP gradient bucket through a comm hook that reduces as DDP does"""
    rendezvous_timeout: float = 300.0
    """seconds a rank waits for rank 0 to name the run folder before giving up"""
    max_record_mb: float = 0.0
    """stop a rank's step, comm, sample records and scalars past this many MB in all (0: no cap)"""

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
        for name in ("skip_first", "wait", "warmup", "repeat"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{option_name(name)} must be >= 0, got {getattr(self, name)}")
        if self.active < 1:
            raise ConfigError(f"--active must be >= 1, got {self.active}")
        if not 0 < self.sample_hz <= 1000:
            raise ConfigError(f"--sample-hz must be in (0, 1000], got {self.sample_hz}")
        if not self.max_record_mb >= 0:
            raise ConfigError(f"--max-record-mb must be >= 0, got {self.max_record_mb}")
        if not self.rendezvous_timeout > 0:
            raise ConfigError(f"--rendezvous-timeout must be > 0, got {self.rendezvous_timeout}")


def _field_type(f: dataclasses.Field) -> type:
    # With `from __future__ import annotations` the annotation is the string "int", "bool"...
    return {"bool": bool, "int": int, "float": float, "str": str}[str(f.type)]


def option_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


@lru_cache(maxsize=1)
def field_help() -> dict[str, str]:
    """Field name -> the docstring line under it in TracerConfig's source."""
    tree = ast.parse(inspect.getsource(TracerConfig))
    body = tree.body[0].body
    helps = {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            helps[node.target.id] = after.value.value.strip()
    return helps


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


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
        raise ConfigError(f"{where} must be {'an integer' if kind is int else 'a number'}, got {text!r}") from None


def from_env(environ: Mapping[str, str]) -> dict:
    """The RANKTRACE_* variables as field values; unknown ones are errors."""
    fields = {env_name(f.name): f for f in dataclasses.fields(TracerConfig)}
    values = {}
    for key, text in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        f = fields.get(key)
        if f is None:
            known = ", ".join(sorted(fields))
            raise ConfigError(f"unknown environment variable {key} (known: {known})")
        values[f.name] = _convert(_field_type(f), text, key)
    return values


USAGE = "python -m tracer.record [tracer options] SCRIPT [script args]"


def help_text() -> str:
    helps = field_help()
    lines = [f"usage: {USAGE}", "",
             "Runs SCRIPT as __main__ under the ranktrace tracer (also under torchrun:",
             "torchrun --nproc-per-node N -m tracer.record [tracer options] SCRIPT [args]).",
             "Tracer options go before SCRIPT; everything after SCRIPT is the script's.", "",
             "options (each also settable as the environment variable shown):"]
    for f in dataclasses.fields(TracerConfig):
        kind = _field_type(f)
        flag = option_name(f.name) + ("" if kind is bool else f" {f.name.upper()}")
        default = "" if kind is bool else f" (default: {f.default})"
        lines.append(f"  {flag:<26} {helps[f.name]}{default}  [{env_name(f.name)}]")
    lines.append(f"  {'-h, --help':<26} show this help and exit")
    return "\n".join(lines)


def split_argv(argv: Sequence[str]) -> tuple[dict, str | None, list[str], bool]:
    """Split `[options] SCRIPT [args]` into (option values, script, script args, help asked).

    Options are recognised only before the first word that is not an option or an option's
    value; that word is the script and the rest is passed to it untouched.
    """
    fields = {option_name(f.name): f for f in dataclasses.fields(TracerConfig)}
    values: dict = {}
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            i += 1
            break
        if word in ("-h", "--help"):
            return values, None, [], True
        if not word.startswith("-") or word == "-":
            break
        name, has_value, text = word.partition("=")
        f = fields.get(name)
        if f is None:
            raise ConfigError(f"unknown option {name} (see --help)")
        kind = _field_type(f)
        if kind is bool:
            if has_value:
                raise ConfigError(f"{name} takes no value")
            values[f.name] = True
        else:
            if not has_value:
                i += 1
                if i >= len(argv):
                    raise ConfigError(f"{name} needs a value")
                text = argv[i]
            values[f.name] = _convert(kind, text, name)
        i += 1
    if i >= len(argv):
        return values, None, [], False
    return values, argv[i], list(argv[i + 1:]), False


def resolve(argv: Sequence[str], environ: Mapping[str, str] | None = None):
    """(config, script, script args, help asked) from the command line and the environment."""
    environ = os.environ if environ is None else environ
    cli, script, script_args, wants_help = split_argv(argv)
    if wants_help:
        return None, None, [], True
    values = from_env(environ)
    values.update(cli)
    config = TracerConfig(**values)
    if script is None:
        raise ConfigError(f"no script given; usage: {USAGE}")
    return config, script, script_args, False


def print_help(file=None) -> None:
    print(help_text(), file=file or sys.stdout)
