"""Reading a run's records while the ranks write them: only the bytes appended since the last
read, of each rank's manifest, steps, comms and samples file (tracer.schema names them).

Nothing here locks or writes anything in the run folder. Each read opens the file by name,
reads from the offset it had reached and closes it again: a rank renames `<name>.tmp` to
`<name>` when it ends (the same file, the same inode, so the offset still holds), and a file on
a shared file system is only seen to grow by opening it again. A last line without its newline
is left for the next read. A file met for the first time larger than CATCH_UP_BYTES (a watch
started late in a long run) is read from its last CATCH_UP_BYTES on, and no read takes more
than READ_BUDGET_BYTES of one file, so that a refresh stays short however much was written.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import msgspec

from tracer import schema
from tracer.capture.capture_requests import FileLog

# A rank's record files by kind: the kinds this module reads.
KIND_FILES = {"manifest": schema.MANIFEST_FILE, "steps": schema.STEPS_FILE,
              "comms": schema.COMMS_FILE, "samples": schema.SAMPLES_FILE}
KIND_TYPES = {"manifest": schema.ManifestRecord, "steps": schema.StepRecord,
              "comms": schema.CommRecord, "samples": schema.DeviceSample}
# Of the samples only the newest counts (the memory of a rank without it in its step records).
NEWEST_ONLY = {"samples"}
CATCH_UP_BYTES = 1 << 20
READ_BUDGET_BYTES = 1 << 20


def _name_re() -> re.Pattern:
    rank = re.escape("{rank}")
    kinds = "|".join(f"(?P<{kind}>{re.escape(p).replace(rank, r'[0-9]+', 1)})"
                     for kind, p in KIND_FILES.items())
    return re.compile(rf"^(?:{kinds})(?P<tmp>{re.escape(schema.TEMP_SUFFIX)})?$")


_NAME_RE = _name_re()
_RANK_RE = re.compile(r"^rank([0-9]+)\.")


def record_file(name: str) -> tuple[int, str, bool] | None:
    """(rank, kind, still a .tmp) of a rank's record file name; None for any other name."""
    match = _NAME_RE.match(name)
    if match is None:
        return None
    kind = next(k for k in KIND_FILES if match[k] is not None)
    return int(_RANK_RE.match(name)[1]), kind, match["tmp"] is not None


class FileTail:
    """The bytes appended to one record file since the last read, whole lines only."""

    def __init__(self, path: str, rank: int):
        self.path = path
        self.rank = rank
        self.offset = 0
        self.inode: int | None = None
        self.problems: list[str] = []

    @property
    def where(self) -> str:
        return f"{self.path}: rank {self.rank}"

    def read(self, path: str | None = None) -> bytes | None:
        """Whole lines appended since the last read, from `path` (the file's name now); None
        where the file cannot be opened (renamed or removed since it was listed)."""
        self.path = path or self.path
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            stat = os.fstat(fd)
            size = stat.st_size
            start = self._start(stat.st_ino, size)
            want = min(size - self.offset, READ_BUDGET_BYTES)
            data = os.pread(fd, want, self.offset) if want > 0 else b""
        except OSError as exc:
            self.problems.append(f"{self.where}: cannot read ({exc.strerror or exc})")
            return b""
        finally:
            os.close(fd)
        if start is not None:  # joined late: from the first whole line of the last part
            cut = data.find(b"\n") + 1
            self.offset += cut
            data = data[cut:]
        end = data.rfind(b"\n") + 1
        if end == 0 and len(data) >= READ_BUDGET_BYTES:
            self.problems.append(f"{self.where}: a line longer than {READ_BUDGET_BYTES} bytes "
                                 f"at byte {self.offset} skipped")
            self.offset += len(data)
            return b""
        self.offset += end
        return data[:end]

    def _start(self, inode: int, size: int) -> int | None:
        """Where reading starts over: a new file, or one cut shorter than what was read."""
        first = self.inode is None
        if not first and (inode != self.inode or size < self.offset):
            self.problems.append(f"{self.where}: the file was replaced or cut short; read again "
                                 f"from its start")
            self.offset = 0
        self.inode = inode
        if first and size > CATCH_UP_BYTES:
            self.offset = size - CATCH_UP_BYTES
            self.problems.append(f"{self.where}: joined late: read from its last "
                                 f"{CATCH_UP_BYTES >> 20} MiB")
            return self.offset
        return None


def decode(data: bytes, kind: str, where: str) -> tuple[list, list[str]]:
    """The records of whole lines `data`; a line that cannot be decoded is skipped with a
    problem naming `where` (the file and rank)."""
    decoder = schema.decoder(KIND_TYPES[kind])
    if kind in NEWEST_ONLY:
        data = data[data.rstrip(b"\n").rfind(b"\n") + 1:]
    try:
        return decoder.decode_lines(data), []
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        pass
    records, problems = [], []
    for line in data.splitlines():
        if not line.strip():
            continue
        try:
            records.append(decoder.decode(line))
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
            why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            problems.append(f"{where}: a line skipped ({why})")
    return records, problems


@dataclass
class Batch:
    """What one poll of a run's folders read."""

    # kind -> [(rank, records)], in file order within each rank
    records: dict[str, list[tuple[int, list]]] = field(
        default_factory=lambda: {kind: [] for kind in KIND_FILES})
    grown: set[int] = field(default_factory=set)  # ranks with new bytes in any file
    requests: list = field(default_factory=list)  # capture requests written since (schema)
    problems: list[str] = field(default_factory=list)


class FolderTail:
    """Every rank's record files in one run folder."""

    def __init__(self, folder: str):
        self.folder = folder
        self.files: dict[tuple[int, str], FileTail] = {}
        self.requests = FileLog(folder)

    def names(self) -> dict[tuple[int, str], str]:
        """(rank, kind) -> the file's name now: the renamed one where both are there."""
        try:
            entries = os.listdir(self.folder)
        except OSError:
            return {}
        found: dict[tuple[int, str], str] = {}
        for name in entries:
            parsed = record_file(name)
            if parsed is not None:
                rank, kind, tmp = parsed
                if not tmp or (rank, kind) not in found:
                    found[rank, kind] = name
        return found

    def poll(self, batch: Batch, owner: dict[int, str]) -> set[int]:
        """Read what was appended into `batch`; the ranks left to the earlier folder that
        `owner` (rank -> folder) gives them."""
        doubled = set()
        for (rank, kind), name in sorted(self.names().items()):
            if owner.setdefault(rank, self.folder) != self.folder:
                doubled.add(rank)
                continue
            path = os.path.join(self.folder, name)
            tail = self.files.get((rank, kind))
            if tail is None:
                tail = self.files[rank, kind] = FileTail(path, rank)
            data = tail.read(path)
            if data is None and name.endswith(schema.TEMP_SUFFIX):
                data = tail.read(path[:-len(schema.TEMP_SUFFIX)])  # renamed since listed
            batch.problems += tail.problems
            tail.problems.clear()
            if data:
                records, problems = decode(data, kind, tail.where)
                batch.grown.add(rank)
                batch.problems += problems
                if records:
                    batch.records[kind].append((rank, records))
        batch.requests += [r for _, r in self.requests.read_new() if r is not None]
        return doubled


class RunTail:
    """A run's folders (one, or one per node), read as one run."""

    def __init__(self, folders: list[str]):
        self.folders: list[FolderTail] = []
        self.owner: dict[int, str] = {}  # rank -> the folder its records are read from
        self.doubled: set[tuple[int, str]] = set()
        for folder in folders:
            self.add(folder)

    def add(self, folder: str) -> None:
        if all(f.folder != folder for f in self.folders):
            self.folders.append(FolderTail(folder))

    def poll(self) -> Batch:
        batch = Batch()
        for folder in self.folders:
            for rank in folder.poll(batch, self.owner):
                if (rank, folder.folder) not in self.doubled:
                    self.doubled.add((rank, folder.folder))
                    batch.problems.append(f"{folder.folder}: rank {rank}: also in "
                                          f"{self.owner[rank]}; read from there only")
        return batch
