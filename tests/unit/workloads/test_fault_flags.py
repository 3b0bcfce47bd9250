"""The workloads' fault flags as their parser reads them: RANK:MS, RANK:STEP and --slow-data's
all:MS, and a clear usage error for anything else."""

import argparse

import pytest

from workloads.common import add_fault_flags, busy_wait


def parse(*argv):
    parser = argparse.ArgumentParser()
    add_fault_flags(parser)
    return parser.parse_args(argv)


def test_rank_and_value_flags_give_the_rank_and_the_number():
    args = parse("--straggle", "1:25", "--hang", "0:3", "--slow-data", "1:20",
                 "--straggle-tail", "0:5")
    assert (args.straggle, args.hang, args.slow_data, args.straggle_tail) == (
        (1, 25.0), (0, 3), (1, 20.0), (0, 5.0))


def test_an_uneven_batch_multiplies_one_ranks_batch_only():
    from workloads.common import rank_batch_size

    args = parse("--uneven-batch", "1:4")
    args.batch_size = 16
    assert args.uneven_batch == (1, 4)
    assert [rank_batch_size(args, r) for r in range(3)] == [16, 64, 16]
    args.uneven_batch = None
    assert rank_batch_size(args, 1) == 16


def test_slow_data_on_every_rank_has_no_rank():
    assert parse("--slow-data", "all:20").slow_data == (None, 20.0)


@pytest.mark.parametrize("flag, value", [
    ("--slow-data", "all:0"), ("--slow-data", "-1:20"), ("--slow-data", "20"),
    ("--slow-data", "some:20"), ("--straggle", "1"), ("--straggle", "-1:5"), ("--hang", "1:x"),
    ("--uneven-batch", "1:0"), ("--uneven-batch", "1:2.5")])
def test_a_bad_value_is_a_usage_error_naming_the_form(flag, value, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse(f"{flag}={value}")
    assert exit_.value.code == 2
    assert "must be RANK:" in capsys.readouterr().err


def test_busy_wait_spends_at_least_its_time_on_the_cpu():
    import time

    wall, cpu = time.perf_counter(), time.thread_time()
    busy_wait(20)
    assert time.perf_counter() - wall >= 0.020
    assert time.thread_time() - cpu >= 0.010  # busy, not asleep
