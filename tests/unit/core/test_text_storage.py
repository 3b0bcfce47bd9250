"""The commands keep their frames' text as Python strings (analysis.core.frames.text_in_python):
the same `str` dtype and the same results as Arrow's, without converting each text column, and a
caller's own pandas setting is left as it was."""

from __future__ import annotations

import json

import pandas as pd

from analysis import breakdown
from analysis.core.frames import text_in_python, with_text_in_python
from analysis.report.json_document import dumps, json_document
from analysis.run import analysed_run
from helpers.launch import DATA


def test_frames_made_in_the_context_hold_python_strings_and_the_setting_comes_back():
    before = pd.get_option("mode.string_storage")
    with text_in_python():
        inside = pd.DataFrame({"op": ["all_reduce", None]})["op"]
    outside = pd.DataFrame({"op": ["all_reduce", None]})["op"]
    assert inside.dtype.storage == "python" and inside.dtype == "str"
    assert inside.isna().tolist() == [False, True]
    assert pd.get_option("mode.string_storage") == before
    assert outside.dtype.storage != "python" or before == "python"


def test_a_decorated_command_runs_in_the_context_and_returns_its_code():
    @with_text_in_python
    def main(code: int) -> int:
        assert pd.get_option("mode.string_storage") == "python"
        return code

    before = pd.get_option("mode.string_storage")
    assert main(3) == 3
    assert pd.get_option("mode.string_storage") == before


def test_the_breakdown_analyses_with_python_strings_and_gives_what_the_library_gives(
        monkeypatch, capsys):
    """The same JSON document from the command (Python strings) as from the library with Arrow's
    strings (pandas' default where pyarrow is installed), on a real 2-rank run."""
    run_dir = DATA / "ddp_cpu"
    seen = []
    real = analysed_run.analyse_run

    def analyse_run(*args, **kwargs):
        seen.append(pd.get_option("mode.string_storage"))
        return real(*args, **kwargs)

    monkeypatch.setattr(analysed_run, "analyse_run", analyse_run)
    before = pd.get_option("mode.string_storage")
    assert breakdown.main([str(run_dir), "--format", "json", "--no-cache"]) == 0
    assert seen == ["python"] and pd.get_option("mode.string_storage") == before
    command = json.loads(capsys.readouterr().out)
    library = json.loads(breakdown_document(run_dir))
    assert command == library


def breakdown_document(run_dir) -> str:
    with pd.option_context("mode.string_storage", "pyarrow"):
        run = analysed_run.open_run(run_dir, use_cache=False)
        assert run.report.collectives["op"].dtype.storage == "pyarrow"
        return dumps(json_document([run.report]))
