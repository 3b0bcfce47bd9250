"""The ordered list of capture requests every rank reads alike: in torchrun's store, or in files.

`FileLog`: records numbered by file name in the run folder (capture.request{N}.jsonl, and the
asks of python -m tracer.capture, capture.ask{N}.jsonl), each written whole under a temporary
name and linked to the first free number (a link never replaces a file, so two writers never
take one number). `StoreLog`: the requests as keys of torchrun's rendezvous store under
STORE_PREFIX, numbered by the store's atomic counter. An ask is answered by one rank: the one
that claims it in the store, or rank 0 where the list is in files; its answer, a request, is
also written as a file for python -m tracer.capture to read. Used off the training thread only.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

from tracer import schema

STORE_PREFIX = "ranktrace/capture"
STORE_TIMEOUT_S = 5.0
MAX_RECORD_BYTES = 1 << 16


class FileLog:
    def __init__(self, run_dir: str, pattern: str = schema.CAPTURE_REQUEST_FILE,
                 record_type=schema.CaptureRequest):
        self.run_dir = run_dir
        self.pattern = pattern
        self.decoder = schema.decoder(record_type)
        self.next = 0  # the first record not read yet

    def path(self, index: int) -> str:
        return os.path.join(self.run_dir, self.pattern.format(index=index))

    def append(self, record) -> int:
        """Write `record` under the next free number; that number."""
        tmp = os.path.join(self.run_dir, f"capture.{os.getpid()}.{time.time_ns()}"
                                         f"{schema.TEMP_SUFFIX}")
        with open(tmp, "wb") as f:
            f.write(schema.ENCODER.encode(record) + b"\n")
        try:
            index = 0
            while True:
                try:
                    os.link(tmp, self.path(index))
                    return index
                except FileExistsError:
                    index += 1
        finally:
            os.remove(tmp)

    def read_new(self) -> list[tuple[int, object]]:
        """(number, record) of each record written since the last call; None for one that
        cannot be decoded."""
        found = []
        while True:
            # os.open, not open(): the file is missing on almost every pass, and a missing file
            # costs open() about 30 us of the worker's cold wake-up, os.open 5.
            try:
                fd = os.open(self.path(self.next), os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return found
            try:
                data = os.read(fd, MAX_RECORD_BYTES)
            finally:
                os.close(fd)
            try:
                record = self.decoder.decode(data)
            except Exception:
                record = None
            found.append((self.next, record))
            self.next += 1


class StoreLog:
    def __init__(self, store, run_id: str, attempt: int):
        self.store = store
        self.prefix = f"{STORE_PREFIX}/{run_id}/attempt{attempt}"
        self.decoder = schema.decoder(schema.CaptureRequest)
        self.next = 0

    @classmethod
    def connect(cls, launch) -> StoreLog:
        import torch.distributed as dist

        store = dist.TCPStore(launch.master_addr, launch.master_port, is_master=False,
                              timeout=timedelta(seconds=STORE_TIMEOUT_S),
                              wait_for_workers=False)
        return cls(store, launch.run_id, launch.attempt)

    def claim(self, ask: int) -> bool:
        """Whether this rank is the first to claim ask number `ask` (and so answers it)."""
        return int(self.store.add(f"{self.prefix}/ask{ask}", 1)) == 1

    def append(self, request: schema.CaptureRequest) -> int:
        index = int(self.store.add(f"{self.prefix}/count", 1)) - 1
        self.store.set(f"{self.prefix}/{index}", schema.ENCODER.encode(request))
        return index

    def read_new(self) -> list[tuple[int, schema.CaptureRequest | None]]:
        found = []
        count = int(self.store.add(f"{self.prefix}/count", 0))
        while self.next < count:
            key = f"{self.prefix}/{self.next}"
            if not self.store.check([key]):
                break  # numbered, not written yet: the next pass reads it
            try:
                request = self.decoder.decode(self.store.get(key))
            except Exception:
                request = None
            found.append((self.next, request))
            self.next += 1
        return found
