"""The tracer's options: the command line, the environment, and their help against
docs/tracer.md."""

from __future__ import annotations

import dataclasses
import re

import pytest

from analysis.core import limits
from helpers.launch import REPO, TINY, launch
from tracer.options import config as config_mod
from tracer.options.config import ConfigError, TracerConfig
from tracer.options.environment import ANALYSIS_VARIABLES


# ---- options --------------------------------------------------------------------------------
def test_options_before_the_script_are_ours_and_the_rest_the_scripts():
    config, script, args = config_mod.resolve(
        ["--active", "2", "--record-shapes", "--out=/x", "train.py", "--active", "9", "-v"], {})
    assert (script, args) == ("train.py", ["--active", "9", "-v"])
    assert config.active == 2 and config.record_shapes is True and config.out == "/x"
    assert config.warmup == TracerConfig().warmup


@pytest.mark.parametrize("argv,script,args", [
    (["train.py", "--", "-x"], "train.py", ["--", "-x"]),  # the script's own `--` stays
    (["--", "train.py", "--help"], "train.py", ["--help"]),  # ours ends the tracer's options
    (["--samples-per-step", "64", "train.py", "-h"], "train.py", ["-h"]),
])
def test_everything_after_the_script_reaches_it_untouched(argv, script, args):
    assert config_mod.resolve(argv, {})[1:] == (script, args)


def test_samples_per_step_comes_from_the_command_line_or_the_environment():
    config, *_ = config_mod.resolve(["s.py"], {"RANKTRACE_SAMPLES_PER_STEP": "256"})
    assert config.samples_per_step == 256
    config, *_ = config_mod.resolve(["--samples-per-step", "32", "s.py"],
                                    {"RANKTRACE_SAMPLES_PER_STEP": "256"})
    assert config.samples_per_step == 32
    assert config_mod.resolve(["s.py"], {})[0].samples_per_step == 0


def test_environment_sets_options_and_the_command_line_wins():
    env = {"RANKTRACE_SAMPLE_HZ": "2.5", "RANKTRACE_ACTIVE": "4", "RANKTRACE_NO_COMMS": "yes",
           "OTHER": "ignored"}
    config, *_ = config_mod.resolve(["--active", "6", "s.py"], env)
    assert (config.sample_hz, config.active, config.no_comms) == (2.5, 6, True)


@pytest.mark.parametrize("argv,env,message", [
    (["--activ", "2", "s.py"], {}, "unrecognized arguments: --activ"),
    (["s.py"], {"RANKTRACE_ACTIV": "2"}, "unknown environment variable RANKTRACE_ACTIV"),
    (["--active", "0", "s.py"], {}, "--active must be >= 1"),
    (["--sample-hz", "-1", "s.py"], {}, "--sample-hz must be in"),
    (["--wait", "x", "s.py"], {}, "--wait must be an integer, got 'x'"),
    (["--samples-per-step", "-8", "s.py"], {}, "--samples-per-step must be >= 0"),
    (["s.py"], {"RANKTRACE_NO_PROFILER": "maybe"}, "RANKTRACE_NO_PROFILER must be one of"),
    (["--run-name", "a/b", "s.py"], {}, "--run-name must be a plain folder name"),
    (["--record-shapes=1", "s.py"], {},
     "--record-shapes/--no-record-shapes: ignored explicit argument '1'"),
    (["--active"], {}, "--active: expected one argument"),
    (["--max-record-mb", "-1", "s.py"], {}, "--max-record-mb must be >= 0"),
    (["--active", "2"], {}, "no script given"),
])
def test_bad_options_are_errors_that_name_them(argv, env, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        config_mod.resolve(argv, env)


# ---- booleans: --thing / --no-thing ------------------------------------------------------------
BOOLEANS = [f.name for f in dataclasses.fields(TracerConfig) if str(f.type) == "bool"]


def test_record_shapes_on_by_default_is_turned_off_on_the_command_line():
    assert config_mod.resolve(["s.py"], {})[0].record_shapes is True
    assert config_mod.resolve(["--no-record-shapes", "s.py"], {})[0].record_shapes is False
    on_in_env = {"RANKTRACE_RECORD_SHAPES": "1"}
    assert config_mod.resolve(["--no-record-shapes", "s.py"], on_in_env)[0].record_shapes is False
    assert config_mod.resolve(["--no-record-shapes", "--record-shapes", "s.py"],
                              {})[0].record_shapes is True  # the last one given wins


@pytest.mark.parametrize("name", BOOLEANS)
def test_every_boolean_is_set_and_cleared_on_the_command_line_over_the_environment(name):
    sets, clears = config_mod.switch_options(name)
    assert sets == config_mod.option_name(name)  # the option of old, unchanged
    env = config_mod.env_name(name)
    assert getattr(config_mod.resolve([sets, "s.py"], {env: "0"})[0], name) is True
    assert getattr(config_mod.resolve([clears, "s.py"], {env: "1"})[0], name) is False
    assert getattr(config_mod.resolve(["s.py"], {env: "yes"})[0], name) is True
    assert config_mod.option_arities()[sets] == config_mod.option_arities()[clears] == 0


def test_off_switches_keep_their_flag_and_gain_its_opposite():
    assert config_mod.switch_options("no_profiler") == ("--no-profiler", "--profiler")
    assert config_mod.switch_options("no_flight_recorder") == ("--no-flight-recorder",
                                                               "--flight-recorder")
    assert config_mod.switch_options("with_stack") == ("--with-stack", "--no-with-stack")
    assert not [o for o in config_mod.option_arities() if o.startswith("--no-no-")]
    shown = config_mod.build_parser().format_help()
    assert "--no-no-" not in shown and "--no-profiler, --profiler" in shown
    assert "--record-shapes, --no-record-shapes" in shown


# ---- the analysis's environment variables ----------------------------------------------------
@pytest.mark.parametrize("variable", ANALYSIS_VARIABLES)
def test_the_analysiss_variables_are_let_through_by_the_tracer(variable):
    config, script, _ = config_mod.resolve(["s.py"], {variable: "64", "RANKTRACE_ACTIVE": "2"})
    assert script == "s.py" and config == TracerConfig(active=2)


def test_no_tracer_variable_takes_an_analysis_variables_name():
    tracer_names = {config_mod.env_name(f.name) for f in dataclasses.fields(TracerConfig)}
    assert len(tracer_names) == len(dataclasses.fields(TracerConfig))
    assert not tracer_names & set(ANALYSIS_VARIABLES)
    assert all(name.startswith(config_mod.ENV_PREFIX) for name in ANALYSIS_VARIABLES)


def test_every_ranktrace_variable_the_analysis_reads_is_listed_for_the_tracer():
    named = {name for path in (REPO / "analysis").rglob("*.py")
             for name in re.findall(r"RANKTRACE_[A-Z_]+", path.read_text())}
    assert named and named <= set(ANALYSIS_VARIABLES)
    assert limits.MAX_TRACE_ENV in ANALYSIS_VARIABLES


def test_an_unknown_variable_is_still_an_error_naming_both_lists():
    with pytest.raises(ConfigError, match="unknown environment variable RANKTRACE_MAX_TRACE "
                                          r"\(known: .*RANKTRACE_ACTIVE.*; the analysis's: "
                                          "RANKTRACE_MAX_TRACE_MB\\)"):
        config_mod.resolve(["s.py"], {"RANKTRACE_MAX_TRACE": "64"})


def _documented_options() -> dict[str, tuple[str, str, str]]:
    """docs/tracer.md's options table: option -> (environment variable, meaning, the whole
    option cell)."""
    doc = (REPO / "docs" / "tracer.md").read_text()
    rows = re.findall(r"^\| `((--[a-z-]+)[^`]*)` \| `(RANKTRACE_[A-Z_]+)` \| [^|]+ \| (.+) \|$",
                      doc, re.M)
    return {option: (env, meaning, cell) for cell, option, env, meaning in rows}


def test_help_text_and_docs_table_list_the_same_options():
    helps = config_mod.field_help()
    documented = _documented_options()
    # argparse wraps lines (and breaks words at hyphens): compare without any white space.
    shown = "".join(config_mod.build_parser().format_help().split())
    fields = dataclasses.fields(TracerConfig)
    assert sorted(documented) == sorted(config_mod.option_name(f.name) for f in fields)
    for f in fields:
        option, help_line = config_mod.option_name(f.name), helps[f.name]
        assert help_line, f"{f.name} has no line in TracerConfig's docstring"
        assert documented[option][0] == config_mod.env_name(f.name)
        if str(f.type) == "bool":
            assert documented[option][2] == " / ".join(config_mod.switch_options(f.name))
        assert option in shown and "".join(help_line.split()) in shown, f"{option} not in --help"


def test_help_and_bad_option_exit_before_running_anything(tmp_path):
    shown = launch(TINY, "--losses", tmp_path / "l", tracer=["--help"])
    assert shown.returncode == 0 and "--skip-first" in shown.stdout
    assert not (tmp_path / "l").exists()
    bad = launch(TINY, "--losses", tmp_path / "l", tracer=["--no-such-option"])
    assert bad.returncode == 2
    assert "ranktrace: error: unrecognized arguments: --no-such-option" in bad.stderr
    assert not (tmp_path / "l").exists()
