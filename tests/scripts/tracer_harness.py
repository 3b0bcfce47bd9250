"""The tracer tests' launcher and readers under their older names (tests/test_config.py and
tests/test_tracer_parts.py import them from here): the launching is tests/helpers/launch.py,
the readers tests/helpers/tracer_files.py."""

from __future__ import annotations

from helpers import launch as _launch
from helpers.launch import DDP, REPO, TINY  # noqa: F401
from helpers.tracer_files import *  # noqa: F401,F403
from helpers.tracer_files import SUMMARY_RE  # noqa: F401


def clean_env(**extra: str) -> dict:
    return _launch.torchrun_env(**extra)


def command(tracer_args, script, script_args, nproc: int | None = None,
            torchrun_args=()) -> list[str]:
    return _launch.command(script, script_args, nproc=nproc, tracer=tracer_args,
                           torchrun=torchrun_args)


def run(tracer_args, script, script_args=(), nproc=None, env=None, timeout=120,
        torchrun_args=(), **kwargs):
    return _launch.launch(script, *script_args, nproc=nproc, tracer=tracer_args,
                          torchrun=torchrun_args, env=env, timeout=timeout, **kwargs)


def start(tracer_args, script, script_args=(), env=None, nproc=None):
    return _launch.popen(script, *script_args, nproc=nproc, tracer=tracer_args, env=env)
