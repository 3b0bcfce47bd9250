"""What the session's tests share: a Session opened in the pytest process."""

from __future__ import annotations

import pytest

from tracer.options.config import TracerConfig
from tracer.session import part_registry


@pytest.fixture
def session_in_process(tmp_path, monkeypatch):
    """open(entries, session_options=None, **options): a Session of this process over `entries`
    (default: the real registry), every optional part off unless `options` says otherwise, with
    Session's own keyword arguments `session_options` (`launch`: its LaunchInfo); its worker
    makes no pass of its own, so that the closer's last pass writes every step record."""
    from tracer.parts import log
    from tracer.session.rank_session import Session
    from tracer.session.run_folder import LaunchInfo
    from tracer.session.script_end import ScriptOutcome
    from tracer.steps import step_worker

    monkeypatch.setattr(step_worker, "PERIOD_S", 3600.0)
    opened = []

    def open_session(entries=None, session_options=None, **options):
        if entries is not None:
            monkeypatch.setattr(part_registry, "REGISTRY", list(entries))
        off = dict(no_profiler=True, no_sampler=True, no_comms=True, no_scalars=True)
        config = TracerConfig(**{"out": str(tmp_path), "run_name": "run", **off, **options})
        keywords = dict(session_options or {})
        launch = keywords.pop("launch", LaunchInfo())
        session = Session(config, "train.py", [], launch, **keywords)
        session.open()
        opened.append(session)
        return session

    yield open_session
    for session in opened:
        if session.launcher is not None and session.launcher.active:
            # Its launcher's watch and init_process_group hook go (a no-op once finished).
            session.finish(ScriptOutcome(exit_code=0))
        session.close("ok", 0)  # a no-op for a test's closed session; undoes the hooks if not
    log.set_rank(None)
