"""Flight Recorder entries as torch 2.13's `_dump_fr_trace_json` writes them, captured from a
2-rank gloo DDP run (nn.Linear(10, 10): 110 parameters) and one NCCL entry with
TORCH_NCCL_ENABLE_TIMING=1's fields; and the fakes the Flight Recorder part is tested with."""

from __future__ import annotations

import collections
import json

T0 = 1796167133710753831  # the first entry's time_created_ns
MAIN_THREAD = 139960999484288


def gloo_entry(record_id: int, seq: int, name: str, created_ns: int, input_sizes, dtypes,
               output_sizes=None, retired=True, thread=MAIN_THREAD, pg=("0", "default_pg")):
    """One entry with every field the gloo dump has."""
    return {"collective_seq_id": seq, "input_dtypes": list(dtypes), "input_sizes": input_sizes,
            "is_p2p": False, "op_id": seq, "output_dtypes": list(dtypes),
            "output_sizes": input_sizes if output_sizes is None else output_sizes,
            "p2p_seq_id": 0, "pg_id": 0, "process_group": list(pg), "profiling_name": name,
            "record_id": record_id, "retired": retired, "state": "scheduled",
            "thread_id": str(thread), "thread_name": "python", "time_created_ns": created_ns,
            "time_discovered_completed_ns": 0, "time_discovered_started_ns": 0,
            "timeout_ms": 1800000}


def ddp_gloo_entries() -> list[dict]:
    """DDP's start-up (shape check all_gather, parameter broadcast), a bucket all-reduce, the
    bucket rebuild's two broadcasts, a second bucket all-reduce and a barrier, as captured."""
    return [
        gloo_entry(0, 1, "gloo:all_gather", T0, [[1]], ["Long"], [[2, 1]]),
        gloo_entry(1, 2, "gloo:broadcast", T0 + 1_637_625, [[6]], ["Long"]),
        gloo_entry(2, 3, "gloo:broadcast", T0 + 2_756_720, [[110]], ["Float"]),
        gloo_entry(3, 4, "gloo:all_reduce", T0 + 5_811_871, [[110]], ["Float"]),
        gloo_entry(4, 5, "gloo:broadcast", T0 + 9_340_307, [[3]], ["Int"]),
        gloo_entry(5, 6, "gloo:broadcast", T0 + 9_547_084, [[1]], ["Int"]),
        gloo_entry(6, 7, "gloo:all_reduce", T0 + 10_130_803, [[110]], ["Float"]),
        gloo_entry(7, 8, "gloo:barrier", T0 + 14_784_610, [], []),
    ]


def nccl_entry(record_id: int, seq: int, created_ns: int, state="completed", duration_ms=None,
               name="nccl:all_reduce", sizes=((1024,),), dtype="BFloat16", p2p_seq=0,
               retired=None):
    """`retired`: the watchdog has retired it (None: once completed, as it soon is)."""
    entry = gloo_entry(record_id, seq, name, created_ns, [list(s) for s in sizes], [dtype],
                       retired=state == "completed" if retired is None else retired)
    entry.update(state=state, p2p_seq_id=p2p_seq, is_p2p=p2p_seq > 0,
                 time_discovered_started_ns=created_ns + 1000,
                 time_discovered_completed_ns=created_ns + 5000 if state == "completed" else 0)
    if duration_ms is not None:
        entry["duration_ms"] = duration_ms
    return entry


def dump_json(entries: list[dict], pg_ranks="[0, 1]") -> bytes:
    """The whole dump, as the function returns it."""
    return json.dumps({"entries": entries, "version": "2.10", "comm_lib_version": "",
                       "nccl_comm_state": {},
                       "pg_config": {"0": {"desc": "default_pg", "name": "0",
                                           "ranks": pg_ranks}},
                       "pg_status": {}}).encode()


class ListWriter:
    def __init__(self):
        self.records = []

    def write(self, record) -> None:
        self.records.append(record)


class FakeRecorder:
    """What the Flight Recorder part uses of the comms part."""

    def __init__(self):
        self.issue_spans = None
        self.native_ops = 0
        self.flight_recorded = False
        self.writer = ListWriter()
        self.timing = collections.namedtuple("Timing", "issues_writer")(ListWriter())
        self.rank = 0


class Dumps:
    """A dump function returning the given dumps in turn (the last one again after that)."""

    def __init__(self, *dumps):
        self.dumps = list(dumps)

    def __call__(self) -> bytes:
        return self.dumps.pop(0) if len(self.dumps) > 1 else self.dumps[0]
