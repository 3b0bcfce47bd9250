"""Who issued an op (CommRecord.issuer): the DDP and FSDP units the tracer saw built, and the rule
that names DDP's and FSDP's own ops, on Flight Recorder entries captured from a 2-rank DDP run
and on ops as the hooks see them (tracer.comms.owners, tracer.comms.fsdp.AfterImport)."""

from __future__ import annotations

import collections
import sys
import threading
import types

import pytest
import torch
from torch import nn

from helpers import flight_entries as captured
from tracer import schema
from tracer.comms.flight import FlightRecorder
from tracer.comms.fsdp import AfterImport
from tracer.comms.owners import (
    DdpUnit,
    Owners,
    ddp_unit,
    fsdp1_sizes,
    fsdp2_sizes,
)
from tracer.comms.patching import thread

MAIN_THREAD, T0 = captured.MAIN_THREAD, captured.T0
CAPTURED = "0"  # the captured entries' process group
MIB = 1 << 20
# The captured run's DDP(nn.Linear(10, 10)): built from T0 - 1 ms to T0 + 3 ms, its shape check
# (all_gather, broadcast) and parameter broadcast inside; the bucket all-reduces, the rebuild's
# broadcasts of the bucket order and a barrier after.
BUILT_FROM, BUILT_NS = T0 - 1_000_000, T0 + 3_000_000


def captured_ddp(built_ns=BUILT_NS) -> DdpUnit:
    linear = nn.Linear(10, 10)
    module = types.SimpleNamespace(_module_parameters=list(linear.parameters()),
                                   bucket_bytes_cap=25 * MIB)
    return ddp_unit(module, CAPTURED, built_ns)


def owners_of_the_captured_run() -> Owners:
    owners = Owners(clock_ns=iter([BUILT_FROM, BUILT_NS]).__next__)
    span = owners.building(schema.ISSUER_DDP)
    span[0] = MAIN_THREAD  # built on the captured run's main thread
    owners.built(span)
    owners.add_ddp(captured_ddp())
    return owners


def test_a_ddp_unit_is_what_its_buckets_can_be():
    unit = captured_ddp()
    assert (unit.pg, unit.params, unit.elements, unit.whole) == (CAPTURED, 2, 110, {110})
    assert unit.bound == 25 * MIB // 4 + 100  # the cap in float32 elements, plus the weight
    # Frozen parameters are not reduced; a float16 group is a bucket of its own before the
    # rebuild, and its 2-byte elements set how many a bucket can hold after it.
    frozen, half = nn.Linear(4, 4), nn.Linear(8, 8).half()
    frozen.requires_grad_(False)
    module = types.SimpleNamespace(
        _module_parameters=[*frozen.parameters(), *nn.Linear(10, 10).parameters(),
                            *half.parameters()], bucket_bytes_cap=MIB)
    unit = ddp_unit(module, "3", 0)
    assert (unit.params, unit.elements, unit.whole) == (4, 110 + 72, {110, 72})
    assert unit.bound == MIB // 2 + 100
    assert ddp_unit(types.SimpleNamespace(_module_parameters=list(frozen.parameters())),
                    "3", 0) is None


def test_buckets_fit_the_cap_after_the_rebuild_and_are_whole_groups_before_it():
    # 10M float32 elements with a 25 MiB cap: a rebuilt bucket holds at most 6.55M + 1M.
    unit = DdpUnit(pg="0", built_ns=0, params=20, elements=10_000_000,
                   whole=frozenset({10_000_000}), bound=25 * MIB // 4 + 1_000_000)
    assert unit.holds_bucket(10_000_000)  # the first backward's one bucket
    assert unit.holds_bucket(7_000_000)
    assert not unit.holds_bucket(8_000_000)  # over any rebuilt bucket, and not the whole group
    assert not unit.holds_bucket(10_000_001) and not unit.holds_bucket(0)
    assert unit.holds_bucket_order(21) and not unit.holds_bucket_order(22)


def test_every_native_op_of_the_captured_ddp_run_is_ddps():
    owners = owners_of_the_captured_run()
    recorder = captured.FakeRecorder()
    recorder.owners = owners
    # The parameter broadcast and the barrier went through hooked calls (the hooks' own ops).
    hooked = [[MAIN_THREAD, T0 + 2_700_000, T0 + 2_900_000],
              [MAIN_THREAD, T0 + 14_700_000, T0 + 14_900_000]]
    dump = captured.Dumps(captured.dump_json(captured.ddp_gloo_entries()))
    part = FlightRecorder(recorder, dump, collections.deque(), 1024, clock_ns=lambda: T0 + 10**9)
    recorder.issue_spans.extend(hooked)
    part.drain()
    written = [(r.op, r.dtype, r.bytes, r.issuer) for r in recorder.writer.records]
    assert written == [
        ("all_gather", "int64", 16, "ddp"),    # shape check, while DDP was being built
        ("broadcast", "int64", 48, "ddp"),     # shape check
        ("all_reduce", "float32", 440, "ddp"),  # the first backward's one bucket
        ("broadcast", "int32", 12, "ddp"),     # the rebuild: 2 parameter indices and the count
        ("broadcast", "int32", 4, "ddp"),      # the rebuild: 1 bucket size
        ("all_reduce", "float32", 440, "ddp"),  # the rebuilt bucket
    ]
    issued = recorder.timing.issues_writer.records
    assert [r.issuer for r in issued] == ["ddp"] * 6
    assert b'"issuer":"ddp"' in schema.ENCODER.encode(recorder.writer.records[0])


@pytest.mark.parametrize("op, pg, dtype, elements, thread_id, created_ns", [
    ("all_reduce", "7", "float32", 110, MAIN_THREAD, T0 + 10**7),   # another group
    ("all_reduce", "0", "float32", 111, MAIN_THREAD, T0 + 10**7),   # more than the gradients
    ("all_reduce", "0", "float32", 110, MAIN_THREAD, T0 - 10**7),   # before DDP was built
    ("all_reduce", "0", "float32", 110, 7, T0),                     # another thread, while built
    ("all_reduce", "0", "int64", 110, MAIN_THREAD, T0 + 10**7),     # no gradient dtype
    ("broadcast", "0", "int64", 3, MAIN_THREAD, T0 + 10**7),        # not the bucket order's
    ("broadcast", "0", "int32", 4, MAIN_THREAD, T0 + 10**7),        # more than 2 params + 1
    ("all_gather", "0", "float32", 110, MAIN_THREAD, T0 + 10**7),   # DDP all-gathers no bucket
])
def test_a_native_op_is_ddps_only_where_group_kind_size_and_time_fit(op, pg, dtype, elements,
                                                                     thread_id, created_ns):
    owners = owners_of_the_captured_run()
    assert owners.of_native(op, pg, dtype, elements, str(thread_id), created_ns) is None


def test_a_compressed_bucket_keeps_its_element_count():
    owners = owners_of_the_captured_run()
    # A built-in FP16_COMPRESS hook all-reduces the 110 float32 gradients as 110 float16.
    assert owners.of_native("all_reduce", "0", "float16", 110, str(MAIN_THREAD),
                            T0 + 10**7) == "ddp"


def test_ops_issued_while_a_unit_is_built_are_its_frameworks():
    owners = Owners()
    assert owners.of_hooked("broadcast", "c10d", "0", torch.ones(3), 12) is None
    outer = owners.building(schema.ISSUER_FSDP1)
    inner = owners.building(schema.ISSUER_DDP)  # a construction inside another: the outer's
    assert inner is None and thread.issuer == "fsdp1"
    assert owners.of_hooked("broadcast", "ddp", "0", torch.ones(3), 12) == "fsdp1"
    seen_elsewhere = []
    other = threading.Thread(target=lambda: seen_elsewhere.append(
        owners.of_hooked("all_reduce", "c10d", "0", torch.ones(3), 12)))
    other.start()
    other.join()
    assert seen_elsewhere == [None]  # the mark is this thread's
    owners.built(inner)
    assert thread.issuer == "fsdp1"
    owners.built(outer)
    assert thread.issuer is None
    assert owners.of_hooked("all_reduce", "c10d", "0", torch.ones(3), 12) is None
    assert owners.of_hooked("all_reduce", "ddp", "0", torch.ones(3), 12) == "ddp"  # comm hook


def test_fsdp_ops_are_named_by_group_kind_and_size():
    owners = Owners()
    owners.add_fsdp(schema.ISSUER_FSDP2, [("0", "all_gather", 144), ("0", "reduce_scatter", 144)])
    gathered = torch.empty(144)
    assert owners.of_hooked("all_gather", "c10d", "0", gathered, 576) == "fsdp2"
    assert owners.of_hooked("reduce_scatter", "c10d", "0", gathered, 576) == "fsdp2"
    # mixed precision: the same elements in bfloat16
    assert owners.of_hooked("all_gather", "c10d", "0", gathered.bfloat16(), 288) == "fsdp2"
    assert owners.of_hooked("all_gather", "c10d", "0", torch.empty(145), 580) is None
    assert owners.of_hooked("all_gather", "c10d", "1", gathered, 576) is None
    assert owners.of_hooked("all_reduce", "c10d", "0", gathered, 576) is None
    assert owners.of_native("reduce_scatter", "0", "float32", 144, "1", T0) == "fsdp2"


def group(name: str, size: int = 2):
    return types.SimpleNamespace(group_name=name, size=lambda: size)


def test_fsdp1_sizes_are_its_flat_parameters():
    # Built, a flat parameter is this rank's padded shard: 98 of 196 elements on 2 ranks.
    handle = types.SimpleNamespace(flat_param=torch.empty(98), world_size=2,
                                   uses_sharded_strategy=True, process_group=group("0"))
    unit = types.SimpleNamespace(_handle=handle, _inter_node_pg=None)
    name = lambda pg: pg.group_name
    assert fsdp1_sizes(unit, name) == [("0", "all_gather", 196), ("0", "reduce_scatter", 196)]
    unit._inter_node_pg = group("5")  # HYBRID_SHARD: the shard all-reduced across nodes
    assert fsdp1_sizes(unit, name)[-1] == ("5", "all_reduce", 98)
    handle.uses_sharded_strategy = False  # NO_SHARD: the whole gradient all-reduced
    assert fsdp1_sizes(unit, name) == [("0", "all_reduce", 98)]
    assert fsdp1_sizes(types.SimpleNamespace(_handle=None), name) == []


def test_fsdp2_sizes_are_its_parameter_groups_padded_shards():
    params = [types.SimpleNamespace(padded_sharded_param_size=torch.Size([8, 8])),
              types.SimpleNamespace(padded_sharded_param_size=torch.Size([8]))]
    mesh = types.SimpleNamespace(shard_process_group=group("0", 2))
    unit = types.SimpleNamespace(mesh_info=mesh, fsdp_params=params)
    name = lambda pg: pg.group_name
    assert fsdp2_sizes(unit, name) == [("0", "all_gather", 144), ("0", "reduce_scatter", 144)]
    mesh.replicate_process_group = group("9")  # HSDP
    assert fsdp2_sizes(unit, name)[-1] == ("9", "all_reduce", 72)


def test_a_hook_fires_once_after_an_import_and_leaves_no_trace(tmp_path, monkeypatch):
    package = tmp_path / "ranktrace_probe_package"
    package.mkdir()
    (package / "__init__.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    finder = AfterImport("ranktrace_probe_package",
                         lambda: seen.append(sys.modules["ranktrace_probe_package"].VALUE))
    sys.meta_path.insert(0, finder)
    try:
        import ranktrace_probe_package
        assert seen == [7]  # after the module's code ran
        assert finder not in sys.meta_path
        loader = ranktrace_probe_package.__loader__
        assert type(loader).__name__ == "SourceFileLoader"
        assert ranktrace_probe_package.__spec__.loader is loader
    finally:
        finder.remove()
        sys.modules.pop("ranktrace_probe_package", None)


def test_a_construction_is_forgotten_once_the_flight_recorder_has_read_past_it():
    owners = Owners(clock_ns=iter([100, 200, 300, 500]).__next__)
    done = owners.building(schema.ISSUER_DDP)
    owners.built(done)              # 100 to 200
    still = owners.building(schema.ISSUER_FSDP2)  # from 300, not finished
    owners.prune(250)
    assert list(owners.spans) == [still]
    assert owners.of_native("broadcast", "0", "int64", 6, str(threading.get_ident()),
                            400) == "fsdp2"
    owners.built(still)


class BuiltUnit:
    """A stand-in for an FSDP unit class: its constructor issues nothing, its unit one size."""

    def __init__(self, elements):
        self.elements = elements
        self.issuer_while_built = thread.issuer


def test_a_torch_without_one_unit_class_still_observes_the_other(monkeypatch):
    from tracer.comms import fsdp
    from tracer.comms.patching import Patches
    monkeypatch.setattr(fsdp, "FSDP_PACKAGE", __name__)  # imported already: observed at install
    monkeypatch.setattr(fsdp, "UNITS", (
        ("ranktrace_no_such_module", "FullyShardedDataParallel", "fsdp1", None),
        (__name__, "BuiltUnit", "fsdp2", lambda unit, name: [("0", "all_gather", unit.elements)]),
    ))
    original = BuiltUnit.__init__
    recorder = types.SimpleNamespace(active=True, failed=[])
    recorder.fail = lambda what, exc=None: recorder.failed.append(what)
    owners, patches = Owners(), Patches(lambda *a: None)
    hooks = fsdp.FsdpHooks(recorder, owners)
    hooks.install(patches)
    try:
        unit = BuiltUnit(144)
        assert unit.issuer_while_built == "fsdp2" and thread.issuer is None
        assert owners.fsdp == {("0", "all_gather", 144): "fsdp2"} and recorder.failed == []
    finally:
        hooks.uninstall()
        patches.restore()
    assert BuiltUnit.__init__ is original
