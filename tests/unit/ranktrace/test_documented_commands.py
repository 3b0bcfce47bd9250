"""Every command line that README.md and docs/*.md show still works.

Each `ranktrace ...` line (in a code block, or inline in backticks; `torchrun ... ranktrace
record` and the `python -m` forms too) is parsed: its subcommand exists and every option it shows
is one the subcommand takes (for `record` and `sweep`, those before the script). Those that run
on CPU in seconds then run, in this process, against a copy of a small recorded run
(tests/data/ddp_cpu), placeholders such as RUN, A, B or traces/ standing for it; the others are
left out for a reason listed in NOT_RUN. `make TARGET` lines must name a target of the Makefile,
and `python PATH` lines a file of the repository.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from analysis import breakdown, diff, scaling, timeline
from helpers.launch import DATA
from ranktrace import cli, sweep
from ranktrace.watch import options as watch_options
from tracer.capture import capture_command
from tracer.options import config

REPO = Path(__file__).resolve().parents[3]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# subcommand -> its parser
PARSERS = {"record": config.build_parser, "breakdown": breakdown.build_parser,
           "timeline": timeline.build_parser, "diff": diff.build_parser,
           "scaling": scaling.build_parser, "capture": capture_command.build_parser,
           "sweep": sweep.build_parser, "watch": watch_options.build_parser}
# subcommand -> the main that runs it here
MAINS = {"breakdown": breakdown.main, "timeline": timeline.main, "diff": diff.main,
         "scaling": scaling.main}
# The `python -m` forms of the subcommands.
PYTHON_M = {command.python_m: name for name, command in cli.SUBCOMMANDS.items()}
PYTHON_M["python -m analysis.breakdown"] = "breakdown"

# Commands parsed but not run, and why: (a pattern of the command line, the reason).
NOT_RUN = [
    (r"ranktrace (record|sweep)\b", "starts training processes (torchrun), seconds to minutes "
                                    "each: the tracer's and the sweep's integration tests run "
                                    "them"),
    (r"ranktrace capture\b", "asks a running job: the capture tests run it against live ranks"),
    (r"ranktrace watch\b", "a live view that follows a running job: its tests drive it"),
    (r"--scheduler\b", "needs a Dask cluster: tests/integration/test_breakdown_on_dask_workers.py"),
    (r"--capture\b", "needs a run with a capture window: the capture tests record one"),
    (r"--all\b|--run\b", "needs a folder of several runs: tests/unit/ingest covers it"),
    (r"--peak-tflops\b", "the MFU tests run it on runs with known FLOPs"),
    (r"/mnt/|/tmp/|OUTDIR|~", "a path of the reader's machine"),
]
# Placeholders in the documents' command lines that stand for a run folder.
RUN_WORDS = {"RUN", "traces/RUN", "traces/", "traces", "A", "B", "PATH", "FILE", "traces/BEFORE",
             "traces/AFTER", "traces/SWEEP", "SWEEP", "traces/<run>", "RUN/", "traces/RUN/",
             "traces/RUN_A", "traces/RUN_B"}


@dataclass(frozen=True)
class Shown:
    """One command line as a document shows it."""

    where: str  # document:line
    text: str


def _code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, text) of the command lines of the fenced code blocks, a line ending in `\\`
    joined with the next; in a block that shows a session (`$ command`, then its output), only
    the `$` lines."""
    found, block, pending, start, inside = [], [], "", 0, False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            if inside:
                session = any(t.startswith("$ ") for _, t in block)
                found += [(n, t[2:] if session else t) for n, t in block
                          if not session or t.startswith("$ ")]
            inside, block = not inside, []
            continue
        if not inside:
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        block.append((start, pending + line))
        pending = ""
    return found


COMMAND = re.compile(r"^(?:timeout (?:-s \w+ )?\d+ )?(ranktrace \w|torchrun |python -m |"
                     r"python \S+\.py|python scripts/|make \w)")


def shown_commands() -> list[Shown]:
    """Every command line of README.md and docs/*.md: code block lines and inline code spans
    that start as a command does."""
    shown = []
    for document in DOCUMENTS:
        text = document.read_text()
        name = document.relative_to(REPO)
        for number, line in _code_lines(text):
            line = line.split(" # ")[0].strip()
            if COMMAND.match(line):
                shown.append(Shown(f"{name}:{number}", line))
        prose = re.sub(r"```.*?```", lambda m: "\n" * m[0].count("\n"), text, flags=re.S)
        for number, line in enumerate(prose.splitlines(), 1):
            for span in re.findall(r"`([^`]+)`", line):
                if re.match(r"(ranktrace \w|torchrun .*ranktrace|python -m (analysis|tracer|"
                            r"ranktrace)\.\w)", span):
                    shown.append(Shown(f"{name}:{number}", span.strip()))
    return shown


def _subcommand(words: list[str]) -> tuple[str | None, list[str]]:
    """(the ranktrace subcommand, its arguments) of a command line's words; (None, []) where it
    runs none."""
    text = " ".join(words)
    for form, name in PYTHON_M.items():
        if text.startswith(form + " ") or text == form:
            return name, words[len(form.split()):]
    if "ranktrace" in words:
        at = words.index("ranktrace")
        # a lower-case word: `ranktrace COMMAND --help` names no subcommand, and
        # `ranktrace watch: ...` is a line the watch prints
        if at + 1 < len(words) and re.fullmatch(r"[a-z]+", words[at + 1]):
            return words[at + 1], words[at + 2:]
    if "-m" in words and "tracer.record" in words:  # torchrun ... -m tracer.record
        return "record", words[words.index("tracer.record") + 1:]
    return None, []


def _options(arguments: list[str], name: str) -> list[str]:
    """The options a command line shows: every `--option` (`--option=VALUE` too, and those in
    `[...]` of a synopsis), for record and sweep only those before the script."""
    options = []
    for word in arguments:
        word = word.strip("[]")
        if name in ("record", "sweep") and (word.endswith(".py") or word == "SCRIPT"):
            break
        for part in word.split("|"):
            if re.match(r"^--?[a-zA-Z]", part):
                options.append(part.split("=")[0])
    return options


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:  # an unbalanced quote in a synopsis: split on blanks
        return text.split()


COMMANDS = shown_commands()
RANKTRACE = [c for c in COMMANDS if _subcommand(_words(c.text))[0] is not None]


def test_the_documents_show_commands_of_every_kind():
    names = {_subcommand(_words(c.text))[0] for c in RANKTRACE}
    assert names == set(cli.SUBCOMMANDS), names
    assert len(RANKTRACE) > 60


@pytest.mark.parametrize("shown", RANKTRACE, ids=[c.where for c in RANKTRACE])
def test_every_option_a_document_shows_is_one_its_command_takes(shown):
    name, arguments = _subcommand(_words(shown.text))
    assert name in cli.SUBCOMMANDS, f"{shown.where}: no subcommand {name!r}: {shown.text}"
    known = set(PARSERS[name]()._option_string_actions)
    if name == "sweep":
        known |= set(config.build_parser()._option_string_actions)
    unknown = [o for o in _options(arguments, name)
               if o not in known and o not in config.RENAMED]
    assert not unknown, f"{shown.where}: {shown.text}: ranktrace {name} has no {unknown}"


def _runnable(shown: Shown) -> bool:
    """Whether the line is a whole command to run here: an analysis command given a run (a bare
    name such as `ranktrace diff` in a sentence is only parsed)."""
    name, arguments = _subcommand(_words(shown.text))
    return (name in MAINS and "..." not in shown.text
            and any(word in RUN_WORDS for word in arguments)
            and not any(re.search(pattern, shown.text) for pattern, _ in NOT_RUN))


def _distinct(shown: list[Shown]) -> dict[str, list[str]]:
    """Each command to run -> where it is shown: lines that come to the same arguments once
    their placeholders are filled (`diff A B`, `diff traces/BEFORE traces/AFTER`) run once."""
    places: dict[str, list[str]] = {}
    first: dict[tuple, str] = {}
    for command in shown:
        name, arguments = _subcommand(_words(command.text))
        key = (name, *_argv(arguments, Path("<run>"), Path("<out>")))
        text = first.setdefault(key, command.text)
        places.setdefault(text, []).append(command.where)
    return places




def _argv(arguments: list[str], run: Path, out: Path) -> list[str]:
    """The arguments to run: the optional `[...]` parts of a synopsis and a redirection left
    out, each placeholder of a run replaced by `run`, each file or folder written under
    `out`."""
    argv, depth = [], 0
    for word in arguments:
        if word in (">", ">>", "|", "&&", "2>&1"):  # the shell's: the command ends here
            break
        opens, closes = word.count("["), word.count("]")
        if depth or opens:
            depth += opens - closes
            continue
        if argv and argv[-1] in ("--html", "--out", "-o", "--svg"):
            word = str(out / Path(word).name)
        elif word in RUN_WORDS:
            word = str(run)
        argv.append(word)
    return argv


RUNNABLE = [c for c in RANKTRACE if _runnable(c)]
TO_RUN = _distinct(RUNNABLE)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A copy of a small recorded run (its cache written beside it, not into tests/data)."""
    root = tmp_path_factory.mktemp("documented")
    run = root / "traces" / "20261205-000000-ddp"
    shutil.copytree(DATA / "ddp_cpu", run)
    return run


@pytest.mark.parametrize("text", list(TO_RUN), ids=[TO_RUN[t][0] for t in TO_RUN])
def test_every_documented_analysis_command_runs_on_a_recorded_run(text, recorded, tmp_path,
                                                                  monkeypatch):
    monkeypatch.chdir(tmp_path)
    name, arguments = _subcommand(_words(text))
    argv = _argv(arguments, recorded, tmp_path)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = MAINS[name](argv, prog=f"ranktrace {name}")
    where = ", ".join(TO_RUN[text])
    assert code == 0, f"{where}: ranktrace {name} {' '.join(argv)}: {err.getvalue()}"
    assert out.getvalue() or "wrote" in err.getvalue()


def test_every_make_target_and_script_shown_exists():
    targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))
    for shown in COMMANDS:
        words = _words(shown.text)
        if words[0] == "make":
            assert words[1] in targets, f"{shown.where}: no make target {words[1]}"
        elif words[0] == "python" and not words[1].startswith("-"):
            assert (REPO / words[1]).exists(), f"{shown.where}: no {words[1]}"
        elif words[0] == "torchrun":
            scripts = [w for w in words if w.startswith("workloads/")]
            assert all((REPO / s).exists() for s in scripts), f"{shown.where}: {scripts}"


def test_commands_left_out_are_left_out_for_a_listed_reason():
    left_out = [c for c in RANKTRACE if c not in RUNNABLE]
    for shown in left_out:
        name, arguments = _subcommand(_words(shown.text))
        reasons = [why for pattern, why in NOT_RUN if re.search(pattern, shown.text)]
        named_only = not any(word in RUN_WORDS for word in arguments)  # `ranktrace diff`
        assert reasons or name not in MAINS or "..." in shown.text or named_only, shown
    assert len(TO_RUN) >= 10
