"""The Part interface (tracer.parts.part): a part fails once, with one line naming its rank,
and tells the session."""

from __future__ import annotations

import logging

from tracer.parts.part import Part


def test_a_part_fails_once_with_one_line_naming_its_rank_and_tells_the_session(capsys):
    root = logging.getLogger()
    handler = logging.StreamHandler()  # a script's own logging set-up doubles nothing
    root.addHandler(handler)
    told = []
    part = Part()
    part.name, part.rank, part.on_failure = "sampler", 3, told.append
    try:
        assert part.fail("first failure") and not part.fail("second failure")
    finally:
        root.removeHandler(handler)
    assert part.failed and part.error == "first failure" and told == [part]
    assert capsys.readouterr().err == "ranktrace: rank3 sampler: first failure\n"
