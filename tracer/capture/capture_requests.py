"""The ordered list of capture requests every rank reads alike: in torchrun's store, or in files.

`FileLog`: records numbered by file name in the run folder (capture.request{N}.jsonl, and the
asks of python -m tracer.capture, capture.ask{N}.jsonl), each written whole under a temporary
name and linked to the first free number (a link never replaces a file, so two writers never
take one number). `StoreLog`: the requests as keys of torchrun's rendezvous store under
STORE_PREFIX, numbered by the store's atomic counter. An ask is answered by one rank: the one
that claims it in the store, or rank 0 where the list is in files; its answer, a request, is
also written as a file for python -m tracer.capture to read. Used off the training thread only.

Whatever is found there is read within bounds: at most MAX_RECORD_BYTES of a file, only regular
files (a FIFO, a device or a folder under a record's name reads as a record that cannot be
decoded, and never blocks), at most MAX_READ records a call; a store whose count runs more than
MAX_BACKLOG ahead of what was read is not read further (StoreLog.broken), and a file writer
tries MAX_BACKLOG numbers past the last it took at most.
"""

from __future__ import annotations

import os
import stat
import time
from datetime import timedelta

from tracer import schema

STORE_PREFIX = "ranktrace/capture"
STORE_TIMEOUT_S = 5.0
MAX_RECORD_BYTES = 1 << 16
MAX_READ = 100  # records read in one call; the next call reads on
MAX_BACKLOG = 1000  # requests numbered and not read, past which a store's list is not believed


def shown(text: str) -> str:
    """`text` with control characters escaped, for the terminal (names read from files)."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


class FileLog:
    def __init__(self, run_dir: str, pattern: str = schema.CAPTURE_REQUEST_FILE,
                 record_type=schema.CaptureRequest):
        self.run_dir = run_dir
        self.pattern = pattern
        self.decoder = schema.decoder(record_type)
        self.next = 0  # the first record not read yet
        self.free = 0  # the first number this writer may take

    def path(self, index: int) -> str:
        return os.path.join(self.run_dir, self.pattern.format(index=index))

    def append(self, record) -> int:
        """Write `record` under the next free number; that number. OSError when MAX_BACKLOG
        numbers after the last one this writer took are all taken (a folder flooded with
        files under the records' names)."""
        tmp = os.path.join(self.run_dir, f"capture.{os.getpid()}.{time.time_ns()}"
                                         f"{schema.TEMP_SUFFIX}")
        with open(tmp, "wb") as f:
            f.write(schema.ENCODER.encode(record) + b"\n")
        try:
            for index in range(self.free, self.free + MAX_BACKLOG):
                try:
                    os.link(tmp, self.path(index))
                except FileExistsError:
                    continue
                self.free = index + 1
                return index
            raise OSError(f"{MAX_BACKLOG} numbers from {self.free} on are taken in "
                          f"{self.run_dir}")
        finally:
            os.remove(tmp)

    def read_new(self) -> list[tuple[int, object]]:
        """(number, record) of each record written since the last call (MAX_READ at most);
        None for one that cannot be read or decoded."""
        found = []
        while len(found) < MAX_READ:
            # os.open, not open(): the file is missing on almost every pass, and a missing file
            # costs open() about 30 us of a thread's cold wake-up, os.open 5. O_NONBLOCK: a FIFO
            # under a record's name must not hold the reader.
            try:
                fd = os.open(self.path(self.next), os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
            except FileNotFoundError:
                return found
            except OSError:
                fd = None  # a name that cannot be opened: a record that cannot be read
            data = _read_regular(fd) if fd is not None else None
            try:
                record = self.decoder.decode(data) if data is not None else None
            except Exception:
                record = None
            found.append((self.next, record))
            self.next += 1
        return found


def _read_regular(fd: int) -> bytes | None:
    """At most MAX_RECORD_BYTES of the open file `fd` (closed here); None unless a regular file
    that reads."""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, MAX_RECORD_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)


class StoreLog:
    """The list in torchrun's store. The first error of the store (no answer within
    STORE_TIMEOUT_S, a value that is no number where a count is kept, a connection the server
    closed) sets `broken`: the store is not used again, so that a store gone wrong costs one
    error, not one a pass."""

    def __init__(self, store, run_id: str, attempt: int):
        self.store = store
        self.prefix = f"{STORE_PREFIX}/{run_id}/attempt{attempt}"
        self.decoder = schema.decoder(schema.CaptureRequest)
        self.next = 0
        self.broken = ""  # why the list is not read any more

    @classmethod
    def connect(cls, launch) -> StoreLog:
        import torch.distributed as dist

        store = dist.TCPStore(launch.master_addr, launch.master_port, is_master=False,
                              timeout=timedelta(seconds=STORE_TIMEOUT_S),
                              wait_for_workers=False)
        return cls(store, launch.run_id, launch.attempt)

    def _call(self, method: str, *args):
        """store.method(*args); StoreBroken once the store has failed."""
        if self.broken:
            raise StoreBroken(self.broken)
        try:
            return getattr(self.store, method)(*args)
        except Exception as exc:
            self.broken = f"torchrun's store failed ({type(exc).__name__}: {exc})"
            raise StoreBroken(self.broken) from None

    def claim(self, ask: int) -> bool:
        """Whether this rank is the first to claim ask number `ask` (and so answers it)."""
        return int(self._call("add", f"{self.prefix}/ask{ask}", 1)) == 1

    def append(self, request: schema.CaptureRequest) -> int:
        index = int(self._call("add", f"{self.prefix}/count", 1)) - 1
        self._call("set", f"{self.prefix}/{index}", schema.ENCODER.encode(request))
        return index

    def read_new(self) -> list[tuple[int, schema.CaptureRequest | None]]:
        """(number, request) of each request written since the last call (MAX_READ at most);
        None for one that cannot be decoded. Raises StoreBroken."""
        found = []
        count = int(self._call("add", f"{self.prefix}/count", 0))
        if count - self.next > MAX_BACKLOG:
            self.broken = (f"the store's count of capture requests jumped to {count} from "
                           f"{self.next} read")
            raise StoreBroken(self.broken)
        while self.next < count and len(found) < MAX_READ:
            key = f"{self.prefix}/{self.next}"
            if not self._call("check", [key]):
                break  # numbered, not written yet: the next pass reads it
            value = self._call("get", key)
            try:
                request = self.decoder.decode(value[:MAX_RECORD_BYTES + 1])
            except Exception:
                request = None
            found.append((self.next, request))
            self.next += 1
        return found


class StoreBroken(RuntimeError):
    """The store failed once (StoreLog.broken says how); it is not used again."""
