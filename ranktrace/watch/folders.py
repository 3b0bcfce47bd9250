"""Which folders the watch follows: the run folder(s) that PATHs name, waited for until they
appear (docs/viewing.md, "Which run").

A run folder holds a rank's record files (tracer.schema.RECORD_FILES, `.tmp` or renamed). A
PATH that is one is followed as it is; a PATH that is not is a folder of runs (one level down,
or two: `DIR/<node>/RUN`, each agent writing its own folder on a shared file system). Of those,
the watch follows the newest run being written: one that appeared after the watch started, or
one with a record file still `.tmp` that changed within LIVE_S seconds; a run that had ended
when the watch started is not followed (name it to see it). Every folder of the PATHs with the
chosen run's name is one of its folders, as the analysis reads several folders of one run
(analysis.ingest.runs.one_run_of_folders): ranks are read from the first folder that holds them.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from ranktrace.watch.tail import record_file

LIVE_S = 60.0
RESCAN_S = 5.0  # how often a followed run's folders are looked for again (agents start late)


def is_run_folder(path: str) -> bool:
    try:
        return any(record_file(name) is not None for name in os.listdir(path))
    except OSError:
        return False


def _subfolders(path: str) -> list[str]:
    try:
        with os.scandir(path) as entries:
            return sorted(e.path for e in entries if e.is_dir(follow_symlinks=False))
    except OSError:
        return []


def _written_lately(run: str, since: float) -> bool:
    """A record file of `run` still `.tmp` and changed after `since` (time.time())."""
    try:
        names = os.listdir(run)
    except OSError:
        return False
    for name in names:
        parsed = record_file(name)
        if parsed is not None and parsed[2]:
            try:
                if os.stat(os.path.join(run, name)).st_mtime >= since:
                    return True
            except OSError:
                continue
    return False


@dataclass(frozen=True)
class Found:
    folders: list[str]  # the run's folders; empty while waiting
    waiting_for: str  # what the watch waits for, while it waits


class RunLocator:
    def __init__(self, paths: list[str], run: str | None = None):
        self.paths = [os.path.normpath(p) for p in paths]
        self.run = run
        self.started = time.time()
        self.known: set[str] | None = None  # run folders there when the watch started
        self.chosen: str | None = run
        self.folders: list[str] = []
        self.scanned = 0.0

    def find(self, now: float | None = None) -> Found:
        """The run's folders as far as they are there now."""
        now = time.monotonic() if now is None else now
        if self.folders and now - self.scanned < RESCAN_S:
            return Found(self.folders, "")
        self.scanned = now
        if self.chosen is None:
            self.chosen = self._choose()
        if self.chosen is not None:
            found = [f for f in self._named(self.chosen) if f not in self.folders]
            self.folders += [f for f in found if is_run_folder(f)]
        return Found(list(self.folders), self._waiting())

    def _waiting(self) -> str:
        where = ", ".join(self.paths)
        if self.chosen is not None:
            return f"waiting for run {self.chosen} in {where}"
        return f"waiting for a run to start in {where}"

    def _runs(self, path: str) -> list[str]:
        """The run folders in `path`, one or two levels down."""
        runs = []
        for child in _subfolders(path):
            if is_run_folder(child):
                runs.append(child)
            else:
                runs += [g for g in _subfolders(child) if is_run_folder(g)]
        return runs

    def _choose(self) -> str | None:
        """The name of the run to follow, once there is one."""
        own = [p for p in self.paths if is_run_folder(p)]
        if own:
            return os.path.basename(own[0])
        runs = [r for p in self.paths for r in self._runs(p)]
        if self.known is None:
            self.known = set(runs)
            since = self.started - LIVE_S
            candidates = [r for r in runs if _written_lately(r, since)]
        else:
            candidates = [r for r in runs if r not in self.known]
        if not candidates:
            return None
        return os.path.basename(max(candidates, key=_newest_key))

    def _named(self, name: str) -> list[str]:
        """The folders named `name` in the PATHs (or the PATHs themselves)."""
        found = []
        for path in self.paths:
            if os.path.basename(path) == name and is_run_folder(path):
                found.append(path)
                continue
            found += [c for c in (os.path.join(path, name),) if os.path.isdir(c)]
            found += [os.path.join(c, name) for c in _subfolders(path)
                      if os.path.isdir(os.path.join(c, name))]
        unique, seen = [], set()
        for folder in found:
            real = os.path.realpath(folder)
            if real not in seen:
                seen.add(real)
                unique.append(folder)
        return unique


def _newest_key(run: str) -> tuple[float, str]:
    try:
        return os.stat(run).st_mtime, run
    except OSError:
        return 0.0, run
