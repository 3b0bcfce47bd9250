"""The torch.distributed (c10d) wrappers (tracer.comms.c10d) on a 1-rank gloo group: each
collective recorded as the op nccl-tests names, with the bytes of the parameter that holds its
payload; async ops, coalesced blocks, p2p peers and P2POps built with torch's own isend."""

from __future__ import annotations

import torch
import torch.distributed as dist

from tracer.comms.c10d import P2POpEqualWrapper, _payload
from tracer.comms.patching import thread


def records(recorder):
    recorder.drain(wait=True)
    return [(r.op, r.bytes, r.dtype, r.source, r.pg_size, r.async_op, r.timing, r.step)
            for r in recorder.writer.records]


def test_each_collective_is_recorded_with_the_bytes_of_its_payload(recorder):
    recorder.step.value = 4
    dist.all_reduce(torch.ones(6))
    dist.broadcast(torch.ones(5, dtype=torch.float64), src=0)
    dist.reduce(torch.ones(2), dst=0)
    dist.all_gather([torch.empty(7)], torch.ones(7))
    dist.all_gather_single(torch.empty(9), torch.ones(9))
    dist.reduce_scatter_single(torch.empty(11), torch.ones(11))
    dist.all_to_all_single(torch.empty(12), torch.ones(12))
    dist.gather(torch.ones(13), [torch.empty(13)], dst=0)
    dist.scatter(torch.empty(14), [torch.ones(14)], src=0)
    dist.barrier()
    assert records(recorder) == [
        ("all_reduce", 24, "float32", "c10d", 1, False, "host", 4),
        ("broadcast", 40, "float64", "c10d", 1, False, "host", 4),
        ("reduce", 8, "float32", "c10d", 1, False, "host", 4),
        ("all_gather", 28, "float32", "c10d", 1, False, "host", 4),
        ("all_gather", 36, "float32", "c10d", 1, False, "host", 4),
        ("reduce_scatter", 44, "float32", "c10d", 1, False, "host", 4),
        ("all_to_all", 48, "float32", "c10d", 1, False, "host", 4),
        ("gather", 52, "float32", "c10d", 1, False, "host", 4),
        ("scatter", 56, "float32", "c10d", 1, False, "host", 4),
        ("barrier", 0, "none", "c10d", 1, False, "host", 4)]
    assert [r.position for r in recorder.writer.records] == list(range(10))
    assert (recorder.ops, recorder.bytes) == (10, 336)


def test_an_async_op_is_recorded_once_its_work_completes(recorder):
    tensor = torch.full((4,), 2.0)
    work = dist.all_reduce(tensor, async_op=True)
    work.wait()
    assert records(recorder) == [("all_reduce", 16, "float32", "c10d", 1, True, "host", 0)]
    [record] = recorder.writer.records
    assert record.start_ns <= record.end_ns and tensor.tolist() == [2.0] * 4


def test_the_ops_of_a_coalescing_block_are_completed_by_the_blocks_work(recorder):
    with dist._coalescing_manager(async_ops=True) as manager:
        dist.all_reduce(torch.ones(2))
        dist.all_reduce(torch.ones(3))
        assert len(thread.coalescing) == 1  # the block's ops are collected while it is open
    manager.wait()
    assert thread.coalescing == ()
    assert [(op, nbytes) for op, nbytes, *_ in records(recorder)] == [
        ("all_reduce", 8), ("all_reduce", 12)]


def test_payloads_count_as_nccl_tests_counts_them():
    one, wide = torch.ones(3), torch.ones(2, dtype=torch.float64)
    assert _payload(one, "one", 8) == (one, 12)
    assert _payload(one, "per_rank", 8) == (one, 96)  # gather, scatter: every rank's part
    assert _payload([one, wide], "list", 8) == (one, 28)
    assert _payload([[one], [wide, one]], "lists", 8) == (one, 40)
    assert _payload([], "list", 8) == (None, 0)


def test_a_group_without_this_rank_gives_no_group_and_the_default_group_is_named(recorder):
    hooks = recorder.c10d
    assert hooks.group_info(dist.GroupMember.NON_GROUP_MEMBER) is None
    pg, name, size = hooks.group_info(None)
    assert pg is dist.group.WORLD and (name, size) == (str(pg.group_name), 1)
    assert hooks.group_info(pg) == (pg, name, 1)


def test_a_p2p_peer_given_as_a_group_rank_is_recorded_as_its_global_rank(recorder,
                                                                          monkeypatch):
    hooks = recorder.c10d
    positions = {"tensor": 0, "dst": 1, "group": 2, "tag": 3, "group_dst": 4}
    names = ("dst", "group_dst")
    world = dist.group.WORLD
    assert hooks._global_peer(world, positions, (None, 3), {}, names) == 3
    assert hooks._global_peer(world, positions, (None,), {"group_dst": 2}, names) == 2
    assert hooks._global_peer(world, positions, (None,), {}, names) is None
    subgroup = dist.new_group([0])
    monkeypatch.setattr(dist, "get_global_rank", lambda group, rank: 10 + rank)
    assert hooks._global_peer(subgroup, positions, (None,), {"group_dst": 1}, names) == 11


def test_the_p2p_wrappers_pass_torchs_checks_for_isend_and_irecv():
    def original(tensor, dst):
        return "original"

    wrapper = P2POpEqualWrapper(lambda *args: ("wrapper", args), original)
    assert wrapper == original and hash(wrapper) == hash(original) and wrapper != len
    assert wrapper(1, 2) == ("wrapper", (1, 2))
    assert wrapper.__wrapped__ is original and wrapper.__name__ == "original"


def test_p2p_ops_built_with_torchs_own_isend_get_its_wrapper_in_a_copy(recorder):
    hooks = recorder.c10d
    original_isend = hooks.originals["isend"]
    built = dist.P2POp(original_isend, torch.ones(2), 0)
    other = dist.P2POp(dist.irecv, torch.ones(2), 0)  # already the wrapper
    normalized = hooks._normalize_p2p_ops([built, other])
    assert normalized[0] is not built and normalized[0].op is hooks.wrappers["isend"]
    assert normalized[0].tensor is built.tensor and normalized[0].peer == built.peer
    assert built.op is original_isend and normalized[1] is other
    unchanged = [other]
    assert hooks._normalize_p2p_ops(unchanged) is unchanged
