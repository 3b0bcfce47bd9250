"""When each recorded op completed: host clocks, CUDA events, work futures, waits, and `drain`,
which writes the ops whose timing is known (docs/tracer.md, Collective hooks: Timing)."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

import torch

from tracer import schema
from tracer.parts.log import say

MAX_PENDING_FUNCTIONAL = 10_000  # outputs that are never waited on must not pile up forever

_DTYPE_NAMES: dict = {}


def dtype_name(dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return name


def tensor_bytes(tensor) -> int:
    if tensor.is_sparse:
        return tensor._values().nbytes + tensor._indices().nbytes
    return tensor.nbytes


def storage_key(tensor) -> int:
    # Views of a collective's output share its storage; the key is where that storage starts.
    return tensor.data_ptr() - tensor.storage_offset() * tensor.element_size()


class Pending:
    """One issued op whose completion is not yet known."""

    __slots__ = ("step", "op", "source", "pg", "pg_size", "dtype", "nbytes", "start_ns", "t0",
                 "async_op", "peer", "device", "start_event", "end_event", "duration_ns", "keep",
                 "position", "failed", "issuer")

    def __init__(self, step, op, source, pg, pg_size, dtype, nbytes, async_op, peer, device,
                 issuer=None):
        self.step, self.op, self.source, self.pg, self.pg_size = step, op, source, pg, pg_size
        self.dtype, self.nbytes, self.async_op = dtype, nbytes, async_op
        self.peer, self.device, self.issuer = peer, device, issuer
        self.start_event = self.end_event = self.duration_ns = self.keep = self.position = None
        self.failed = False
        self.start_ns = time.time_ns()
        self.t0 = time.perf_counter_ns()


def done_with_error(future) -> bool:
    try:
        future.value()
    except Exception:
        return True
    return False


def issue_record(pending) -> schema.IssueRecord:
    return schema.IssueRecord(
        step=pending.step, op=pending.op, source=pending.source, pg=pending.pg,
        pg_size=pending.pg_size, position=pending.position, dtype=pending.dtype,
        bytes=pending.nbytes, issue_ns=pending.start_ns, peer=pending.peer,
        async_op=pending.async_op, issuer=pending.issuer)


class Timing:
    """The ops issued and not yet written, and the counts of those issued."""

    def __init__(self, writer, current_step: Callable[[], int], use_cuda: bool,
                 event_factory: Callable[[], object] | None, wait_timeout_s: float, fail,
                 issues_writer=None):
        """`issues_writer`: where each op's IssueRecord goes as it is issued (None: nowhere)."""
        self.writer = writer
        self.issues_writer = issues_writer
        self._positions: dict = {}  # pg (collectives) or (pg, op, peer) (p2p) -> next position
        # Issued ops whose CommRecord is not written yet, by id, for stack dumps
        # (tracer.hangs.stack_dumps).
        self.outstanding: dict[int, Pending] = {}
        self.current_step = current_step
        self.use_cuda = bool(use_cuda)
        self.wait_timeout_s = wait_timeout_s
        self._fail = fail
        self.ops = 0
        self.bytes = 0
        self.dropped = 0  # issued ops whose completion was never seen (not written)
        self._event_factory = event_factory
        self._events_for_all = event_factory is not None
        self._free_events: list = []
        self._count_lock = threading.Lock()
        self._done: collections.deque = collections.deque()  # timing known, waiting for drain
        self._in_flight: dict[int, Pending] = {}  # host-timed, waiting for a future callback
        self._event_pending: collections.deque = collections.deque()  # event-timed, unresolved
        self.wait_pending: dict[int, tuple[object, list]] = {}  # work without future -> its ops
        self._wait_lock = threading.Lock()
        self.functional_pending: collections.OrderedDict = collections.OrderedDict()

    # ---- issue ----------------------------------------------------------------------------------
    def begin(self, op, source, pg_name, pg_size, tensor, nbytes, async_op, peer,
              issuer=None) -> Pending:
        """`issuer`: CommRecord.issuer (tracer.comms.owners), None where none is known."""
        pending = Pending(int(self.current_step()), op, source, pg_name, pg_size,
                          dtype_name(tensor.dtype) if tensor is not None else "none",
                          int(nbytes), bool(async_op), peer,
                          tensor.device if tensor is not None else None, issuer)
        key = pg_name if peer is None else (pg_name, op, peer)
        position = pending.position = self._positions.get(key, 0)
        self._positions[key] = position + 1
        self.outstanding[id(pending)] = pending
        if self.issues_writer is not None:
            self.issues_writer.write(issue_record(pending))
        if tensor is not None and (self._events_for_all or (self.use_cuda and tensor.is_cuda)):
            pending.start_event = self._new_event()
            self._record(pending.start_event, pending.device)
        return pending

    def issued(self, pending) -> None:
        with self._count_lock:
            self.ops += 1
            self.bytes += pending.nbytes

    def _drop(self, pending) -> None:
        self.outstanding.pop(id(pending), None)
        with self._count_lock:
            self.ops -= 1
            self.bytes -= pending.nbytes
            self.dropped += 1
        self._recycle(pending)

    # ---- CUDA events ----------------------------------------------------------------------------
    def _new_event(self):
        try:
            return self._free_events.pop()  # callbacks on other threads share the pool
        except IndexError:
            pass
        if self._event_factory is not None:
            return self._event_factory()
        return torch.cuda.Event(enable_timing=True)

    @staticmethod
    def _record(event, device) -> None:
        if device is not None and device.type == "cuda":
            event.record(torch.cuda.current_stream(device))
        else:
            event.record()

    def _recycle(self, pending) -> None:
        for event in (pending.start_event, pending.end_event):
            if event is not None and len(self._free_events) < 256:
                self._free_events.append(event)
        pending.start_event = pending.end_event = None

    # ---- completion -----------------------------------------------------------------------------
    def complete_now(self, pending) -> None:
        """The op is complete (host) or the current stream is ordered after it (events)."""
        if pending.start_event is None:
            pending.duration_ns = time.perf_counter_ns() - pending.t0
            self._done.append(pending)
        else:
            pending.end_event = self._new_event()
            self._record(pending.end_event, pending.device)
            self._event_pending.append(pending)

    def complete_with_work(self, work, pendings) -> None:
        try:
            future = work.get_future()
        except Exception:
            future = None  # gloo p2p works have none: completion is seen at Work.wait
        if future is None:
            with self._wait_lock:
                self.wait_pending[id(work)] = (work, pendings)
            return
        for pending in pendings:
            if pending.start_event is None:
                self._in_flight[id(pending)] = pending
            else:
                self._event_pending.append(pending)  # end_event stays None until the callback
        timing = self

        def on_done(done):
            # Runs on a c10d thread (gloo) or inline with pool streams ordered after the op (CUDA).
            try:
                failed = done_with_error(done)
                for pending in pendings:
                    pending.failed = failed
                    if pending.start_event is None:
                        pending.duration_ns = time.perf_counter_ns() - pending.t0
                        timing._in_flight.pop(id(pending), None)
                        timing._done.append(pending)
                    else:
                        event = timing._new_event()
                        timing._record(event, pending.device)
                        pending.end_event = event
            except Exception as exc:
                timing._fail("timing a work's completion", exc)

        future.add_done_callback(on_done)

    def on_work_done(self, work) -> None:
        # Entries hold their work, so no other work can share its id while the entry exists.
        with self._wait_lock:
            entry = self.wait_pending.pop(id(work), None)
        if entry is None:
            return
        for pending in entry[1]:
            self.complete_now(pending)

    # ---- functional collectives: complete when an output is waited on ---------------------------
    def await_functional(self, pending, outputs) -> None:
        pending.keep = outputs  # holds the storages so their addresses stay unique until waited
        pending_map = self.functional_pending
        for output in outputs:
            key = storage_key(output)
            earlier = pending_map.pop(key, None)
            if earlier is not None and earlier is not pending:
                # An in-place op on a tensor whose earlier op was never waited: that one is lost.
                self._forget_functional(earlier)
            pending_map[key] = pending
        while len(pending_map) > MAX_PENDING_FUNCTIONAL:
            _, stale = pending_map.popitem(last=False)
            self._forget_functional(stale)

    def _forget_functional(self, pending) -> None:
        """Drop a functional op that will never be waited on: once, with all its outputs' keys
        (a coalesced op has several, and each may be found again later)."""
        if pending.keep is None:
            return  # completed or dropped already
        pending_map = self.functional_pending
        for output in pending.keep:
            key = storage_key(output)
            if pending_map.get(key) is pending:
                del pending_map[key]
        pending.keep = None
        self._drop(pending)

    def functional_waited(self, tensor) -> None:
        pending = self.functional_pending.pop(storage_key(tensor), None)
        if pending is not None and pending.keep is not None:
            for other in pending.keep:  # the other outputs of a coalesced op
                self.functional_pending.pop(storage_key(other), None)
            pending.keep = None
            self.complete_now(pending)

    def not_completed(self) -> list[schema.IssueRecord]:
        """The ops issued and not seen to complete yet, oldest first (any thread)."""
        pendings = [p for p in list(self.outstanding.values()) if p.duration_ns is None]
        return [issue_record(p) for p in sorted(pendings, key=lambda p: p.t0)]

    # ---- drain ----------------------------------------------------------------------------------
    def drain(self, wait: bool = False) -> None:
        self._drain_once()
        if not wait:
            return
        deadline = time.monotonic() + self.wait_timeout_s
        while self._resolvable() and time.monotonic() < deadline:
            time.sleep(0.002)
            self._drain_once()
        self._give_up_pending()

    def _resolvable(self) -> bool:
        return bool(self._in_flight or self.wait_pending
                    or any(p.end_event is not None for p in self._event_pending))

    def _drain_once(self) -> None:
        if self.wait_pending:
            with self._wait_lock:
                entries = list(self.wait_pending.values())
            for work, _ in entries:
                if work.is_completed():
                    self.on_work_done(work)
        for _ in range(len(self._event_pending)):
            pending = self._event_pending.popleft()
            if pending.end_event is not None and pending.end_event.query():
                elapsed_ms = pending.start_event.elapsed_time(pending.end_event)
                pending.duration_ns = int(elapsed_ms * 1e6)
                self._done.append(pending)
            else:
                self._event_pending.append(pending)
        while self._done:
            self._write(self._done.popleft())

    def _give_up_pending(self) -> None:
        left = list(self._in_flight.values()) + list(self._event_pending)
        with self._wait_lock:
            for _, pendings in self.wait_pending.values():
                left.extend(pendings)
            self.wait_pending.clear()
        functional = list({id(p): p for p in self.functional_pending.values()}.values())
        self.functional_pending.clear()
        self._in_flight.clear()
        self._event_pending.clear()
        for pending in left + functional:
            pending.keep = None
            self._drop(pending)
        if left or functional:
            say(f"{len(left) + len(functional)} ops never completed or were never waited on "
                f"within {self.wait_timeout_s:g}s; they are not in the comms file", "comms")

    def _write(self, pending) -> None:
        duration_ns = max(int(pending.duration_ns), 0)
        algbw, busbw = schema.bandwidth_gbps(pending.op, pending.nbytes, pending.pg_size,
                                             duration_ns / 1e9)
        record = schema.CommRecord(
            step=pending.step, op=pending.op, source=pending.source, pg=pending.pg,
            pg_size=pending.pg_size, dtype=pending.dtype, bytes=pending.nbytes,
            start_ns=pending.start_ns, end_ns=pending.start_ns + duration_ns,
            duration_us=duration_ns / 1e3,
            timing="host" if pending.start_event is None else "cuda_event",
            algbw_gbps=algbw, busbw_gbps=busbw, peer=pending.peer, async_op=pending.async_op,
            position=pending.position, failed=pending.failed, issuer=pending.issuer)
        self.outstanding.pop(id(pending), None)
        self._recycle(pending)
        self.writer.write(record)
