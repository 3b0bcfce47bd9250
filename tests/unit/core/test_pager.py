"""Long text on a terminal goes through a pager, as git does (analysis.core.terminal.show): never
where the output is not a terminal, nor with --no-pager, nor where the text fits the screen."""

from __future__ import annotations

import io
import os
import shutil
import sys

from analysis.core import terminal


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


LONG = "".join(f"line {i}\n" for i in range(200))


def _pager_to(path) -> dict:
    """An environment whose pager copies its input, and its LESS, to `path`."""
    script = f"import os, sys; open({str(path)!r}, 'w').write(os.environ.get('LESS', '?') + " \
             f"'|' + sys.stdin.read())"
    return {"PAGER": f"{sys.executable} -c \"{script}\"", "PATH": os.environ["PATH"]}


def test_long_text_on_a_terminal_goes_through_the_pager_with_less_frx(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "get_terminal_size", lambda: os.terminal_size((100, 30)))
    stream = _Terminal()
    terminal.show(LONG, stream=stream, environ=_pager_to(tmp_path / "paged"))
    assert stream.getvalue() == ""
    assert (tmp_path / "paged").read_text() == "FRX|" + LONG


def test_less_as_the_user_set_it_is_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "get_terminal_size", lambda: os.terminal_size((100, 30)))
    terminal.show(LONG, stream=_Terminal(),
                  environ={**_pager_to(tmp_path / "paged"), "LESS": "-S"})
    assert (tmp_path / "paged").read_text() == "-S|" + LONG


def test_no_pager_where_not_a_terminal_asked_not_to_or_the_text_fits(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "get_terminal_size", lambda: os.terminal_size((100, 30)))
    environ = _pager_to(tmp_path / "paged")
    piped = io.StringIO()
    terminal.show(LONG, stream=piped, environ=environ)
    told_not_to = _Terminal()
    terminal.show(LONG, stream=told_not_to, use_pager=False, environ=environ)
    short = _Terminal()
    terminal.show("one\ntwo\n", stream=short, environ=environ)
    assert (piped.getvalue(), told_not_to.getvalue(), short.getvalue()) == (LONG, LONG,
                                                                           "one\ntwo\n")
    assert not (tmp_path / "paged").exists()


def test_an_empty_pager_or_cat_or_one_that_cannot_start_writes_the_text(monkeypatch):
    monkeypatch.setattr(shutil, "get_terminal_size", lambda: os.terminal_size((100, 30)))
    for pager in ("", "cat", "/nonexistent/pager --flag"):
        stream = _Terminal()
        terminal.show(LONG, stream=stream, environ={"PAGER": pager})
        assert stream.getvalue() == LONG, pager
