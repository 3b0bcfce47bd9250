"""Process and host figures read from Linux's /proc through files kept open, with psutil's values.

Opening a /proc file costs far more than reading it again: on the development machine, from a
thread that wakes every 0.1 s (cold caches), opening and reading /proc/stat took 150 us where a
`pread` of the open file took 15, and psutil opens the file on every call (docs/benchmarks.md,
Tracer overhead). The readers here keep each file open and compute what psutil computes from
it, the same way, so that a sample holds the same values as psutil's:

* `StatmRss`: the resident set size, `psutil.Process().memory_info().rss`;
* `SystemCpu`: the busy share of every CPU since the last call, `psutil.cpu_percent(None)`
  (a reader of its own, so the first call measures from the reader's creation);
* `NetBytes`: bytes sent and received over every interface, `psutil.net_io_counters()`'s
  `bytes_sent` and `bytes_recv` (with its correction of counters that wrap).

Each constructor raises OSError or ValueError where /proc is not there or not as expected (not
Linux): the caller then uses psutil itself.
"""

from __future__ import annotations

import os

_READ_SIZE = 1 << 16  # bytes asked per read; a larger file takes further reads


class ProcFile:
    """One /proc file, kept open and read whole again at each `read()`."""

    def __init__(self, path: str):
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def read(self, size: int = _READ_SIZE) -> bytes:
        """The file's text now, whole (at most `size` bytes where one read of them will do)."""
        data = os.pread(self._fd, size, 0)
        if len(data) < size:
            return data
        chunks = [data]
        while chunk := os.pread(self._fd, _READ_SIZE, sum(map(len, chunks))):
            chunks.append(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        os.close(self._fd)


class _Reader:
    _file: ProcFile

    def close(self) -> None:
        self._file.close()


class StatmRss(_Reader):
    """The resident set size from /proc/self/statm: a few microseconds, where psutil takes 15."""

    def __init__(self, path: str = "/proc/self/statm"):
        self._file = ProcFile(path)
        self._page = os.sysconf("SC_PAGE_SIZE")
        self.rss()  # fail now, not at the first sample, if the format is unexpected

    def rss(self) -> int:
        try:
            return int(self._file.read(256).split()[1]) * self._page
        except IndexError:
            raise ValueError("unexpected /proc/self/statm") from None


class SystemCpu(_Reader):
    """psutil.cpu_percent(None) over the first line of /proc/stat: the busy share (%) of every
    CPU since the last call, to 0.1."""

    def __init__(self, path: str = "/proc/stat"):
        self._file = ProcFile(path)
        self._ticks = os.sysconf("SC_CLK_TCK")
        self._last = self._times()

    def _times(self) -> list[float]:
        """user, nice, system, idle, iowait, irq, softirq, steal, guest, guest_nice in seconds:
        as many as the kernel gives (at least 4), as psutil.cpu_times() reads them."""
        line = self._file.read(1024).split(b"\n", 1)[0].split()
        if len(line) < 5 or line[0] != b"cpu":
            raise ValueError("unexpected first line in /proc/stat")
        return [float(x) / self._ticks for x in line[1:11]]

    def percent(self) -> float:
        last, now = self._last, self._times()
        self._last = now
        deltas = [max(0, b - a) for a, b in zip(last, now)]
        # psutil's _cpu_tot_time and _cpu_busy_time, in their order of operations: guest and
        # guest_nice are already counted in user and nice; idle and iowait are not busy.
        total = sum(deltas)
        for guest in deltas[8:10]:
            total -= guest
        busy = total - deltas[3]
        if len(deltas) > 4:
            busy -= deltas[4]
        try:
            return round(busy / total * 100, 1)
        except ZeroDivisionError:
            return 0.0


class NetBytes(_Reader):
    """psutil.net_io_counters()'s bytes_sent and bytes_recv over /proc/net/dev: every
    interface's counters summed, a counter that went down (it wrapped, or the interface was
    reset) counted on from its last value, as psutil's nowrap correction does."""

    def __init__(self, path: str = "/proc/net/dev"):
        self._file = ProcFile(path)
        # interface -> ((sent, received) last read, (sent, received) added for wraps so far)
        self._seen: dict[bytes, tuple[tuple[int, int], tuple[int, int]]] = {}
        self.read()

    def read(self) -> tuple[int, int]:
        """(bytes sent, bytes received) now."""
        seen = {}
        sent_total = received_total = 0
        for line in self._file.read().split(b"\n")[2:]:
            name, colon, counters = line.rpartition(b":")
            if not colon:
                continue
            fields = counters.split()
            if len(fields) < 16:
                raise ValueError("unexpected line in /proc/net/dev")
            counts = (int(fields[8]), int(fields[0]))
            name = name.strip()
            before = self._seen.get(name)
            if before is None:
                added = (0, 0)
            else:
                added = tuple(extra + (old if new < old else 0)
                              for new, old, extra in zip(counts, before[0], before[1]))
            seen[name] = (counts, added)
            sent_total += counts[0] + added[0]
            received_total += counts[1] + added[1]
        self._seen = seen
        return sent_total, received_total
