"""The ingest tests' fixtures."""

import pytest

from analysis.ingest import kineto


@pytest.fixture
def small_chunks(monkeypatch):
    """Cut files into ~2 kB chunks, and count the chunks decoded."""
    monkeypatch.setattr(kineto, "READ_BYTES", 512)
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 2048)
    chunks = []

    class Counting:
        decode = staticmethod(lambda data, real=kineto.EVENTS_DECODER.decode:
                              chunks.append(len(data)) or real(data))

    monkeypatch.setattr(kineto, "EVENTS_DECODER", Counting())
    return chunks
