"""`ranktrace COMMAND` (ranktrace.cli): every subcommand listed and run under its own name, every
--help with its defaults and groups, and the old spellings of renamed options still taken."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from ranktrace import cli
from tracer.options.config import resolve


def _help(capsys, name: str) -> str:
    with pytest.raises(SystemExit) as ended:
        cli.main([name, "--help"])
    assert ended.value.code == 0
    return capsys.readouterr().out


def _entries(text: str) -> dict[str, str]:
    """Each option of a --help text -> its whole entry (the option's lines and the lines of its
    help below them)."""
    entries, current = {}, None
    for line in text.splitlines():
        option = re.match(r"^  (-[-\w]+)", line)
        if option:
            current = option[1]
            entries[current] = line
        elif current and line.startswith("    ") and line.strip():
            entries[current] += " " + line.strip()
        else:
            current = None
    return entries


def test_ranktrace_help_lists_every_subcommand(capsys):
    assert cli.main(["--help"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()
              if line.startswith("  ")]
    assert listed == ["record", "breakdown", "timeline", "diff", "scaling", "capture", "sweep",
                      "watch"]


def test_an_unknown_subcommand_is_an_error_naming_the_choices(capsys):
    assert cli.main(["brekdown"]) == 2
    assert "unknown command 'brekdown' (choose from record, breakdown" in capsys.readouterr().err


@pytest.mark.parametrize("name", list(cli.SUBCOMMANDS))
def test_every_help_shows_its_command_name_groups_and_every_default(capsys, name):
    text = _help(capsys, name)
    assert text.startswith(f"usage: ranktrace {name} ")
    groups = [line for line in text.splitlines() if re.match(r"^[a-z][\w ,()-]*:$", line)]
    assert len(groups) >= 2, groups  # options, and at least one group of the command's own
    entries = {option: entry for option, entry in _entries(text).items() if option != "-h"}
    assert entries
    for option, entry in entries.items():
        assert "default" in entry or "required" in entry, (name, option, entry)


def test_the_old_spellings_still_work_with_a_warning(capsys, tmp_path):
    config, script, _ = resolve(["--repeat", "2", "train.py"], environ={})
    assert config.windows == 2 and script == "train.py"
    assert "--repeat is deprecated; use --windows" in capsys.readouterr().err
    config, _, args = resolve(["train.py", "--repeat", "3"], environ={})
    assert config.windows == 1 and args == ["--repeat", "3"]  # the script's own, untouched
    config, _, _ = resolve(["train.py"], environ={"RANKTRACE_REPEAT": "0"})
    assert config.windows == 0
    assert "RANKTRACE_REPEAT is deprecated" in capsys.readouterr().err
    # capture --steps N (a count) is --active N; the ask fails on a folder that is no run.
    assert cli.main(["capture", str(tmp_path), "--steps", "2"]) == 1
    err = capsys.readouterr().err
    assert "ranktrace capture: warning: --steps is deprecated; use --active" in err
    assert "holds no rank manifest" in err


def test_no_subcommand_is_a_usage_error_on_stderr(capsys):
    assert cli.main([]) == 2
    printed = capsys.readouterr()
    assert printed.out == "" and printed.err.startswith("usage: ranktrace COMMAND")


def test_pyproject_declares_the_ranktrace_script():
    text = (Path(__file__).resolve().parents[3] / "pyproject.toml").read_text()
    scripts = text[text.index("[project.scripts]"):].split("\n[", 1)[0]
    module, function = re.search(r'^ranktrace = "([\w.]+):(\w+)"$', scripts, re.M).groups()
    assert getattr(importlib.import_module(module), function) is cli.console_script
