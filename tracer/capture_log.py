"""The ordered list of capture requests every rank reads alike: in torchrun's store, or in files.

`FileLog`: requests numbered capture.request{N}.jsonl in the run folder, each written whole under
a temporary name and linked to the first free number (a link never replaces a file, so two
writers never take one number). `StoreLog`: the same list as keys of torchrun's rendezvous store
under STORE_PREFIX, numbered by the store's atomic counter; requests written as files (by
`python -m tracer.capture`) are moved into it by whichever rank claims each first. Both are used
off the training thread only.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

from tracer import schema

STORE_PREFIX = "ranktrace/capture"
STORE_TIMEOUT_S = 5.0
_DECODER = schema.decoder(schema.CaptureRequest)


def request_path(run_dir: str, index: int) -> str:
    return os.path.join(run_dir, schema.CAPTURE_REQUEST_FILE.format(index=index))


class FileLog:
    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self.next = 0  # the first request not read yet

    def append(self, request: schema.CaptureRequest) -> int:
        """Write `request` as the next free number; that number."""
        tmp = os.path.join(self.run_dir, f"capture.{os.getpid()}.{time.time_ns()}"
                                         f"{schema.TEMP_SUFFIX}")
        with open(tmp, "wb") as f:
            f.write(schema.ENCODER.encode(request) + b"\n")
        try:
            index = self.next
            while True:
                try:
                    os.link(tmp, request_path(self.run_dir, index))
                    return index
                except FileExistsError:
                    index += 1
        finally:
            os.remove(tmp)

    def read_new(self) -> list[tuple[int, schema.CaptureRequest | None]]:
        """(number, request) of each request written since the last call; None for one that
        cannot be decoded (it is skipped, and named by the caller)."""
        found = []
        while True:
            path = request_path(self.run_dir, self.next)
            try:
                with open(path, "rb") as f:
                    data = f.read(1 << 16)
            except FileNotFoundError:
                return found
            try:
                request = _DECODER.decode(data)
            except Exception:
                request = None
            found.append((self.next, request))
            self.next += 1


class StoreLog:
    def __init__(self, store, run_id: str, attempt: int, files: FileLog):
        self.store = store
        self.prefix = f"{STORE_PREFIX}/{run_id}/attempt{attempt}"
        self.files = files
        self.next = 0

    @classmethod
    def connect(cls, launch, files: FileLog) -> StoreLog:
        import torch.distributed as dist

        store = dist.TCPStore(launch.master_addr, launch.master_port, is_master=False,
                              timeout=timedelta(seconds=STORE_TIMEOUT_S),
                              wait_for_workers=False)
        return cls(store, launch.run_id, launch.attempt, files)

    def append(self, request: schema.CaptureRequest) -> int:
        index = int(self.store.add(f"{self.prefix}/count", 1)) - 1
        self.store.set(f"{self.prefix}/{index}", schema.ENCODER.encode(request))
        return index

    def read_new(self) -> list[tuple[int, schema.CaptureRequest | None]]:
        for number, request in self.files.read_new():
            # Each file's request goes in once, by the first rank to claim it.
            if request is not None and self.store.add(f"{self.prefix}/file{number}", 1) == 1:
                self.append(request)
        found = []
        count = int(self.store.add(f"{self.prefix}/count", 0))
        while self.next < count:
            key = f"{self.prefix}/{self.next}"
            if not self.store.check([key]):
                break  # numbered, not written yet: the next pass reads it
            try:
                request = _DECODER.decode(self.store.get(key))
            except Exception:
                request = None
            found.append((self.next, request))
            self.next += 1
        return found
