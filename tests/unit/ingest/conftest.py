"""The ingest tests' fixtures."""

import pytest

from analysis.ingest import kineto


@pytest.fixture
def small_chunks(monkeypatch):
    """Cut files into ~2 kB chunks, and count the chunks decoded (by either chunk decoder: a
    chunk the integer-timed one refuses is counted again)."""
    monkeypatch.setattr(kineto, "READ_BYTES", 512)
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 2048)
    chunks = []

    class Counting:
        def __init__(self, real):
            self.real = real

        def decode(self, data):
            chunks.append(len(data))
            return self.real.decode(data)

    for name in ("EVENTS_DECODER", "INT_TIMED_EVENTS_DECODER"):
        monkeypatch.setattr(kineto, name, Counting(getattr(kineto, name)))
    return chunks
