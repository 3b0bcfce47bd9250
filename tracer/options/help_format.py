"""What every ranktrace command's --help and options share: each option's default shown, and old
spellings of renamed options still taken, with a warning. It imports only the standard library,
so that the tracer, the analysis and ranktrace's commands may all use it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's ArgumentDefaultsHelpFormatter, but where the help already says its default
    ("(default: one per core)"), or the default is None and the help says what leaving the
    option out means, nothing is added; an on/off flag shows "(default: off)"."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default is None or action.default is argparse.SUPPRESS:
            return text
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            return f"{text} (default: {'on' if action.default else 'off'})"
        if isinstance(action.default, list) and not action.default:
            return f"{text} (default: none)"
        return super()._get_help_string(action)


def parser(prog: str, description: str, **kwargs) -> argparse.ArgumentParser:
    """An ArgumentParser with HelpFormatter and no abbreviated options."""
    return argparse.ArgumentParser(prog=prog, description=description,
                                   formatter_class=HelpFormatter, allow_abbrev=False, **kwargs)


def renamed(argv: Sequence[str], renames: Mapping[str, str], prog: str) -> list[str]:
    """`argv` with each old spelling of an option (a key of `renames`, also as `--old=VALUE`)
    written as its new one, up to a `--`, and one warning on stderr per old spelling used."""
    out, warned = [], set()
    for at, word in enumerate(argv):
        if word == "--":
            return out + list(argv[at:])
        name, equals, value = word.partition("=")
        if name in renames:
            if name not in warned:
                print(f"{prog}: warning: {name} is deprecated; use {renames[name]}",
                      file=sys.stderr)
                warned.add(name)
            word = renames[name] + equals + value
        out.append(word)
    return out
