"""The steps file (rank{R}.steps.jsonl, docs/trace-format.md): one StepRecord per training step,
written by the step-end worker in step order (tracer.parts.record_files: how a record file is
written and what a write error does)."""

from __future__ import annotations

from tracer import schema
from tracer.parts.record_files import JsonlWriter


class StepsWriter(JsonlWriter):
    """The steps file's writer: every finished step record, as the session hands it on."""

    def on_step_record(self, record, notes: dict) -> None:
        self.write(record)


def open_steps_file(setup):
    """The registry's factory of the steps file (a tracer.session.part_registry.PartSetup)."""
    return setup.open_writer(schema.STEPS_FILE, StepsWriter)
