"""The ordered request lists (tracer.capture.capture_requests): files numbered in order, two
writers never on one number, and whatever lies under a record's name read within bounds; the
list in torchrun's store, with a count that cannot be believed."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch.distributed as dist

from tracer import schema
from tracer.capture.capture_requests import (
    MAX_BACKLOG,
    MAX_READ,
    FileLog,
    StoreBroken,
    StoreLog,
    shown,
)


def request(**fields) -> schema.CaptureRequest:
    return schema.CaptureRequest(**{"trigger": "slow_step", "trigger_step": 3, "first_step": 9,
                                    "steps": 3, "t_ns": 1, "trigger_rank": 1, "ratio": 2.5,
                                    "run": "r", **fields})


def test_requests_are_numbered_in_order_and_two_writers_never_share_a_number(tmp_path):
    a, b, reader = FileLog(str(tmp_path)), FileLog(str(tmp_path)), FileLog(str(tmp_path))
    req = request()
    assert [a.append(req), b.append(req), a.append(req)] == [0, 1, 2]
    got = reader.read_new()
    assert [n for n, _ in got] == [0, 1, 2] and got[0][1] == req
    assert reader.read_new() == []
    (tmp_path / schema.CAPTURE_REQUEST_FILE.format(index=3)).write_bytes(b'{"trigger": ')
    assert reader.read_new() == [(3, None)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"capture.request{n}.jsonl" for n in range(4)]  # no temporary file left


def test_what_lies_under_a_records_name_is_read_within_bounds_and_never_blocks(tmp_path):
    names = [tmp_path / schema.CAPTURE_ASK_FILE.format(index=n) for n in range(6)]
    os.mkfifo(names[0])  # a FIFO nobody writes: an open() without O_NONBLOCK would wait
    names[1].mkdir()
    names[2].symlink_to("/dev/zero")  # endless
    names[3].write_bytes(os.urandom(4096))
    names[4].write_bytes(b'{"steps": 1, "t_ns": 1, "run": "' + b"r" * (1 << 17) + b'"}')  # cut
    names[5].symlink_to(tmp_path / "nowhere")  # dangling: ends the list like a missing file
    log = FileLog(str(tmp_path), schema.CAPTURE_ASK_FILE, schema.CaptureAsk)
    started = time.monotonic()
    assert log.read_new() == [(0, None), (1, None), (2, None), (3, None), (4, None)]
    assert time.monotonic() - started < 1.0
    assert log.next == 5


def test_a_flood_of_records_is_read_a_bounded_number_at_a_time(tmp_path):
    log = FileLog(str(tmp_path))
    for n in range(MAX_READ + 5):
        (tmp_path / schema.CAPTURE_REQUEST_FILE.format(index=n)).write_bytes(b"x")
    assert len(log.read_new()) == MAX_READ
    assert len(log.read_new()) == 5


@pytest.fixture
def store():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    yield server


def test_the_store_list_is_read_in_order_and_a_junk_value_reads_as_none(store):
    writer, reader = StoreLog(store, "run", 0), StoreLog(store, "run", 0)
    assert writer.append(request()) == 0
    store.set(f"{writer.prefix}/{int(store.add(f'{writer.prefix}/count', 1)) - 1}",
              os.urandom(4096))
    assert writer.append(request(first_step=20)) == 2
    got = reader.read_new()
    assert [(n, r.first_step if r else None) for n, r in got] == [(0, 9), (1, None), (2, 20)]
    # A number taken and not written yet: read at a later call.
    store.add(f"{writer.prefix}/count", 1)
    assert reader.read_new() == []
    store.set(f"{writer.prefix}/3", schema.ENCODER.encode(request(first_step=40)))
    assert [r.first_step for _, r in reader.read_new()] == [40]
    assert writer.claim(7) and not reader.claim(7)


def test_a_store_count_far_ahead_of_what_was_read_or_a_store_error_stops_its_use(store):
    reader = StoreLog(store, "run", 0)
    store.add(f"{reader.prefix}/count", MAX_BACKLOG + 1)
    with pytest.raises(StoreBroken):
        reader.read_new()
    assert reader.broken == (f"the store's count of capture requests jumped to "
                             f"{MAX_BACKLOG + 1} from 0 read")
    # A count that is no number: the store's own error, then nothing more is asked of it.
    other = StoreLog(store, "other", 0)
    store.set(f"{other.prefix}/count", b"\xff junk")
    with pytest.raises(StoreBroken, match="torchrun's store failed"):
        other.read_new()
    other.store = None  # any call would now fail with AttributeError
    with pytest.raises(StoreBroken):
        other.append(request())
    with pytest.raises(StoreBroken):
        other.claim(0)


def test_two_writers_in_threads_take_distinct_numbers(tmp_path):
    numbers = []

    def write():
        log = FileLog(str(tmp_path))
        numbers.extend(log.append(request()) for _ in range(20))

    threads = [threading.Thread(target=write) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(numbers) == list(range(60))


def test_names_read_from_files_are_shown_with_their_control_characters_escaped():
    assert shown("run\x1b[31m\nred") == "run\\x1b[31m\\nred"
    assert shown("plain é") == "plain é"


def test_a_folder_flooded_under_the_records_names_stops_a_writer_after_a_bounded_search(
        tmp_path, monkeypatch):
    import tracer.capture.capture_requests as requests

    monkeypatch.setattr(requests, "MAX_BACKLOG", 50)
    for n in range(60):
        (tmp_path / schema.CAPTURE_REQUEST_FILE.format(index=n)).write_bytes(b"x")
    with pytest.raises(OSError, match="50 numbers from 0 on are taken"):
        FileLog(str(tmp_path)).append(request())
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        schema.CAPTURE_REQUEST_FILE.format(index=n) for n in range(60))  # no temporary left
    writer = FileLog(str(tmp_path))
    writer.free = 55
    assert writer.append(request()) == 60
