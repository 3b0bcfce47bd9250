"""tracer.probes.procfs: its readers give psutil's own values, read from the same /proc files
(psutil pointed at a folder of written copies through psutil.PROCFS_PATH), and the sampler falls
back to psutil where they cannot be opened."""

from __future__ import annotations

import os

import psutil
import pytest

from tracer.probes import procfs
from tracer.probes.device_sampler import DeviceSampler

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="Linux /proc only")

NET_HEADER = ("Inter-|   Receive                                                |  Transmit\n"
              " face |bytes    packets errs drop fifo frame compressed multicast|bytes    "
              "packets errs drop fifo colls carrier compressed\n")


@pytest.fixture
def fake_proc(tmp_path, monkeypatch):
    """A folder psutil reads as /proc; its own caches start empty."""
    (tmp_path / "net").mkdir()
    monkeypatch.setattr(psutil, "PROCFS_PATH", str(tmp_path))
    psutil.net_io_counters.cache_clear()
    yield tmp_path
    psutil.net_io_counters.cache_clear()


def stat_text(*ticks: int) -> str:
    return ("cpu  " + " ".join(map(str, ticks)) + "\ncpu0 " + " ".join(map(str, ticks))
            + "\nintr 1 2 3\nctxt 99\n")


def net_text(interfaces: dict[str, tuple[int, int]]) -> str:
    """/proc/net/dev with (received, sent) bytes per interface."""
    lines = [f"{name:>6}: {received} 7 0 0 0 0 0 0 {sent} 5 0 0 0 0 0 0\n"
             for name, (received, sent) in interfaces.items()]
    return NET_HEADER + "".join(lines)


def test_system_cpu_is_psutils_cpu_percent(fake_proc):
    stat = fake_proc / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice, as this kernel gives them
    # (psutil reads as many fields as the real /proc/stat had when it was imported)
    fields = len(open("/proc/stat").readline().split()) - 1
    ticks = [1000, 20, 300, 5000, 40, 5, 6, 7, 100, 3][:fields]
    stat.write_text(stat_text(*ticks))
    reader = procfs.SystemCpu(str(stat))
    psutil.cpu_percent(None)  # psutil's reference point, at the same numbers
    seen = []
    # busy, idle only, a counter that went down, guest time inside user time, nothing at all
    for step in ([50, 0, 10, 40, 0, 0, 0, 0, 0, 0], [0, 0, 0, 100, 0, 0, 0, 0, 0, 0],
                 [30, 0, -5, 20, 3, 1, 1, 0, 0, 0], [40, 2, 0, 10, 0, 0, 0, 1, 25, 2],
                 [0] * 10):
        ticks = [t + d for t, d in zip(ticks, step[:fields])]
        stat.write_text(stat_text(*ticks))
        ours, theirs = reader.percent(), psutil.cpu_percent(None)
        assert ours == theirs
        seen.append(ours)
    assert seen[1] == 0.0 and seen[4] == 0.0 and 0 < seen[0] < 100


def test_net_bytes_are_psutils_through_wraps_and_interfaces_coming_and_going(fake_proc):
    dev = fake_proc / "net" / "dev"
    snapshots = [
        {"lo": (1000, 1000), "eth0": (5000, 700)},
        {"lo": (1500, 1500), "eth0": (9000, 800)},
        {"lo": (1600, 1600), "eth0": (100, 50)},  # eth0's counters wrapped (or were reset)
        {"lo": (1700, 1700), "eth0": (300, 60)},
        {"lo": (1800, 1800)},  # eth0 gone
        {"lo": (1900, 1900), "eth0": (10, 20), "ib0": (4000, 4000)},  # back, and a new one
        {"lo": (2000, 2000), "eth0": (5, 30), "ib0": (4100, 4100)},
    ]
    dev.write_text(net_text(snapshots[0]))
    reader = procfs.NetBytes(str(dev))
    psutil.net_io_counters()  # psutil's first reading, as the reader's own in its constructor
    totals = []
    for interfaces in snapshots[1:]:
        dev.write_text(net_text(interfaces))
        counters = psutil.net_io_counters()
        ours = reader.read()
        assert ours == (counters.bytes_sent, counters.bytes_recv)
        totals.append(ours)
    assert totals[0] == (1500 + 800, 1500 + 9000)
    assert totals[1] == (1600 + 800 + 50, 1600 + 9000 + 100)  # counted on from the last value


def test_rss_is_psutils(tmp_path):
    statm = tmp_path / "statm"
    statm.write_text("5000 1234 300 10 0 2000 0\n")
    reader = procfs.StatmRss(str(statm))
    assert reader.rss() == 1234 * os.sysconf("SC_PAGE_SIZE")
    assert abs(procfs.StatmRss().rss() - psutil.Process().memory_info().rss) < 64 << 20


def test_a_file_longer_than_one_read_is_read_whole(tmp_path):
    path = tmp_path / "long"
    text = b"".join(b"line %d\n" % k for k in range(30_000))
    path.write_bytes(text)
    file = procfs.ProcFile(str(path))
    assert file.read() == text
    assert file.read(64) == text  # a short size asks once more until the end
    file.close()


def test_unexpected_files_are_refused(tmp_path):
    bad = tmp_path / "bad"
    bad.write_text("nothing here\n")
    for reader in (procfs.SystemCpu, procfs.StatmRss, procfs.NetBytes):
        with pytest.raises((ValueError, OSError)):
            reader(str(bad) if reader is not procfs.NetBytes else str(tmp_path / "missing"))


def test_the_sampler_uses_psutil_where_proc_cannot_be_read(monkeypatch):
    def unreadable(*args, **kwargs):
        raise OSError("no /proc here")

    for name in ("SystemCpu", "StatmRss", "NetBytes"):
        monkeypatch.setattr(procfs, name, unreadable)
    records = []
    sampler = DeviceSampler(type("W", (), {"write": staticmethod(records.append)}), 50, None)
    sampler._take_sample()
    sampler._take_sample()
    assert sampler._readers == [] and sampler.error is None
    own_rss = psutil.Process().memory_info().rss
    assert own_rss / 2 < records[-1].rss_bytes < own_rss * 2
    assert 0 <= records[-1].cpu_system_pct <= 100 and records[-1].net_sent_bytes_s >= 0
    sampler.stop()
