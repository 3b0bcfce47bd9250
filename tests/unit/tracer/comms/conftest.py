"""The comms tests' fixture: a recorder installed on a 1-rank gloo group in this process."""

import pytest

from helpers.comms_ranks import ListWriter, StepCounter
from tracer.comms import CommsRecorder


@pytest.fixture
def recorder(one_rank):
    """An installed CommsRecorder keeping its records in `recorder.writer.records`, its step
    `recorder.step.value`; uninstalled after the test."""
    step = StepCounter()
    installed = CommsRecorder(ListWriter(), step, use_cuda=False)
    installed.step = step
    installed.install()
    yield installed
    installed.uninstall()
