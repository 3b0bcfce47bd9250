"""Pieces shared by the workload scripts: model, synthetic data, flags, process group, logging.

Every script reads only RANK, LOCAL_RANK and WORLD_SIZE from the environment. Without
WORLD_SIZE (plain ``python workloads/X.py``) the scripts run as a 1-rank world on a
private in-memory store, so no MASTER_ADDR/MASTER_PORT is needed.
"""

import argparse
import functools
import gc
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, default_collate

NUM_CLASSES = 10
SILENT_RANK_EXIT_DELAY_S = 30.0


class Block(nn.Module):
    """Residual MLP block; fc1/fc2 are the column/row pair that tensor parallelism shards."""

    def __init__(self, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(hidden, hidden)
        self.fc2 = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


class MLP(nn.Module):
    """`layers` residual blocks and a classifier head.

    ``blocks`` is an nn.Sequential so a pipeline stage can keep a slice of it and still
    carry the full model's parameter names (``blocks.2.fc1.weight``).
    """

    def __init__(self, hidden: int, layers: int):
        super().__init__()
        self.blocks = nn.Sequential(*(Block(hidden) for _ in range(layers)))
        self.head = nn.Linear(hidden, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


def build_model(hidden: int, layers: int, seed: int) -> MLP:
    """Same seed gives the same initial weights on every rank and in test references."""
    torch.manual_seed(seed)
    return MLP(hidden, layers)


class SyntheticDataset(Dataset):
    """Gaussian inputs labelled by a fixed random projection, so the task is learnable.

    Each sample is generated from (seed, index) alone: any sharding or batching of the
    indices sees the same values, and nothing is held in memory up front.
    """

    def __init__(self, num_samples: int, hidden: int, seed: int):
        self.num_samples, self.hidden, self.seed = num_samples, hidden, seed
        generator = torch.Generator().manual_seed(seed)
        self.projection = torch.randn(hidden, NUM_CLASSES, generator=generator)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index + 1)
        x = torch.randn(self.hidden, generator=generator)
        return x, (x @ self.projection).argmax()


def make_loader(dataset: Dataset, batch_size: int, args, device: torch.device, sampler=None):
    # Fixed order (no shuffle): the data is random already and tests replay it exactly.
    slow = getattr(args, "slow_data", None)
    collate = (functools.partial(_slow_collate, slow[1] / 1e3)
               if slow is not None and slow[0] in (None, env_rank()) else None)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, shuffle=False,
                      num_workers=args.num_workers, pin_memory=device.type == "cuda",
                      collate_fn=collate)


def _slow_collate(seconds: float, samples):
    """--slow-data: the batch is collated after a sleep, inside the loader's __next__ (with
    --num-workers 0 on the training thread, as slow storage or decoding would be)."""
    time.sleep(seconds)
    return default_collate(samples)


def env_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def env_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keeps the module docstring's layout and shows each flag's default."""


class RankZeroParser(argparse.ArgumentParser):
    """Under torchrun every rank parses; only rank 0 may print help or a one-line error."""

    def _print_message(self, message, file=None):
        if env_rank() == 0:
            super()._print_message(message, file)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")

    def exit(self, status=0, message=None):
        if status and env_rank() != 0 and env_world_size() > 1:
            # Rank 0 prints the one error, and its exit makes the launcher stop this rank. Were
            # this rank to exit first, the launcher could stop rank 0 before it printed.
            time.sleep(SILENT_RANK_EXIT_DELAY_S)
        super().exit(status, message)


def _checked(kind, ok, rule: str):
    def parse(text: str):
        value = kind(text)
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
        return value
    parse.__name__ = kind.__name__  # argparse names the type in "invalid int value"
    return parse


positive_int = _checked(int, lambda v: v > 0, "> 0")
non_negative_int = _checked(int, lambda v: v >= 0, ">= 0")
positive_float = _checked(float, lambda v: v > 0, "> 0")


def make_parser(doc: str, distributed: bool = True) -> RankZeroParser:
    parser = RankZeroParser(description=doc, formatter_class=HelpFormatter)
    parser.add_argument("--steps", type=positive_int, default=20, help="optimizer steps")
    parser.add_argument("--batch-size", type=positive_int, default=32,
                        help="samples per step (ddp: per rank and micro-step)")
    parser.add_argument("--hidden", type=positive_int, default=256, help="model width")
    parser.add_argument("--layers", type=positive_int, default=4, help="residual MLP blocks")
    parser.add_argument("--seed", type=int, default=0, help="seed for weights and data")
    parser.add_argument("--lr", type=positive_float, default=0.05, help="SGD learning rate")
    parser.add_argument("--num-workers", type=non_negative_int, default=0,
                        help="DataLoader worker processes")
    parser.add_argument("--compile", action="store_true",
                        help="compile the model with torch.compile (Module.compile(), names kept)")
    parser.add_argument("--save", metavar="PATH",
                        help="write final parameters and per-step losses with torch.save")
    if distributed:
        parser.add_argument("--pg-timeout-s", "--pg-timeout", dest="pg_timeout_s",
                            type=positive_float, default=60.0, metavar="S",
                            help="process-group timeout in seconds, so a dead or stuck peer fails "
                                 "the run quickly")
        add_fault_flags(parser)
    return parser


def rank_and(kind, what: str):
    """Parses RANK:VALUE, as in ``--crash 1:3``."""
    def parse(text: str):
        rank, sep, value = text.partition(":")
        try:
            parsed = (int(rank), kind(value))
        except ValueError:
            parsed = None
        if not sep or parsed is None or parsed[0] < 0 or not parsed[1] >= (kind is int):
            raise argparse.ArgumentTypeError(f"must be RANK:{what}, got {text}")
        return parsed
    parse.__name__ = f"RANK:{what}"
    return parse


def rank_batch_size(args, rank: int) -> int:
    """--batch-size, FACTOR times it on the rank that --uneven-batch RANK:FACTOR names."""
    uneven = getattr(args, "uneven_batch", None)
    return args.batch_size * (uneven[1] if uneven is not None and uneven[0] == rank else 1)


def busy_wait(ms: float) -> None:
    """Spends `ms` ms in a busy loop: busy, not asleep, so that a straggler that computes shows
    up in CPU samples as well."""
    deadline = time.perf_counter_ns() + int(ms * 1e6)
    while time.perf_counter_ns() < deadline:
        pass


def _slow_data(text: str):
    """Parses RANK:MS or all:MS (``--slow-data all:20``): (rank, or None for all, ms)."""
    rank, _, value = text.partition(":")
    try:
        parsed = (None if rank == "all" else int(rank), float(value))
    except ValueError:
        parsed = None
    if parsed is None or (parsed[0] or 0) < 0 or not parsed[1] > 0:
        raise argparse.ArgumentTypeError(f"must be RANK:MS or all:MS, got {text}")
    return parsed


_slow_data.__name__ = "RANK:MS"


def add_fault_flags(parser: argparse.ArgumentParser) -> None:
    """Faults a distributed workload can inject on one rank, to see how a trace shows them."""
    faults = parser.add_argument_group("faults (RANK is the global rank, STEP counts from 1)")
    faults.add_argument("--straggle", type=rank_and(float, "MS"), metavar="RANK:MS",
                        help="RANK spends MS ms of host time in a busy loop before the forward "
                             "pass of every step; every rank then logs its step times")
    faults.add_argument("--straggle-tail", type=rank_and(float, "MS"), metavar="RANK:MS",
                        help="RANK spends MS ms in a busy loop after its backward pass, before "
                             "its optimizer step, in every step: it ends each step late, as a "
                             "rank that logs or checkpoints there, and the others wait for it "
                             "at the next step's first collective")
    faults.add_argument("--slow-data", type=_slow_data, metavar="RANK:MS",
                        help="RANK's DataLoader (every rank's with all:MS) sleeps MS ms in each "
                             "batch it loads, inside the loader's __next__")
    faults.add_argument("--uneven-batch", type=rank_and(int, "FACTOR"),
                        metavar="RANK:FACTOR",
                        help="RANK trains on FACTOR times --batch-size samples per step (an "
                             "uneven data shard; ddp.py only)")
    faults.add_argument("--hang", type=rank_and(int, "STEP"), metavar="RANK:STEP",
                        help="RANK sleeps forever at the start of STEP")
    faults.add_argument("--mismatch", type=rank_and(int, "STEP"), metavar="RANK:STEP",
                        help="at the start of STEP every rank all-reduces one tensor, RANK's "
                             "of a different size")
    faults.add_argument("--crash", type=rank_and(int, "STEP"), metavar="RANK:STEP",
                        help="RANK exits with status 1 (os._exit) at the start of STEP, after a "
                             f"{CRASH_PAUSE_S:g} s pause that lets its peers reach the "
                             "collective it leaves unanswered")


# --crash: how long the rank waits before it exits (Faults.before_forward says why)
CRASH_PAUSE_S = 2.0


class Faults:
    """The fault flags of one rank: call ``before_forward(step)`` at the start of every step,
    ``before_optimizer(step)`` before its optimizer step, ``after_step(step)`` after it."""

    def __init__(self, args, rank: int, device: torch.device):
        self.args, self.rank, self.device = args, rank, device
        self.step_start = (0, 0)

    def _at(self, flag: str, step: int) -> bool:
        value = getattr(self.args, flag, None)
        return value is not None and value == (self.rank, step)

    def before_forward(self, step: int) -> None:
        self.step_start = (time.perf_counter_ns(), time.thread_time_ns())
        if self._at("crash", step):
            say(f"rank {self.rank}: --crash, exiting at step {step}")
            # A rank that dies while its peers already wait on it, as crashes are met in practice:
            # a peer still computing could otherwise be stopped by torchrun before it reports.
            time.sleep(CRASH_PAUSE_S)
            os._exit(1)
        if self._at("hang", step):
            say(f"rank {self.rank}: --hang, sleeping forever at step {step}")
            while True:
                time.sleep(1)
        mismatch = getattr(self.args, "mismatch", None)
        if mismatch is not None and mismatch[1] == step:
            numel = 1024 if self.rank == mismatch[0] else 1
            dist.all_reduce(torch.ones(numel, device=self.device))
        straggle = getattr(self.args, "straggle", None)
        if straggle is not None and straggle[0] == self.rank:
            busy_wait(straggle[1])

    def before_optimizer(self, step: int) -> None:
        tail = getattr(self.args, "straggle_tail", None)
        if tail is not None and tail[0] == self.rank:
            busy_wait(tail[1])

    def after_step(self, step: int) -> None:
        if getattr(self.args, "straggle", None) is not None:
            wall_start, cpu_start = self.step_start
            wall_ns = time.perf_counter_ns() - wall_start
            cpu_ns = time.thread_time_ns() - cpu_start
            say(f"rank {self.rank} step {step} wall_ms {wall_ns / 1e6:.1f} "
                f"cpu_ms {cpu_ns / 1e6:.1f}")


def pick_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def init_distributed(args) -> tuple[int, int, torch.device]:
    """Start the default process group (NCCL on GPU, gloo on CPU); returns rank, world, device."""
    device = pick_device()
    options = dict(backend="nccl" if device.type == "cuda" else "gloo",
                   timeout=timedelta(seconds=args.pg_timeout_s))
    if device.type == "cuda":
        torch.cuda.set_device(device)
        options["device_id"] = device  # binds NCCL to this GPU at init, not lazily
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group(init_method="env://", **options)
    else:
        dist.init_process_group(store=dist.HashStore(), rank=0, world_size=1, **options)
    return dist.get_rank(), dist.get_world_size(), device


def cleanup() -> None:
    if dist.is_initialized():
        # DDP and pipeline stages sit in reference cycles that keep the process group alive.
        # Collect them first so destroying the group joins gloo's worker threads now; a worker
        # left running into interpreter shutdown can abort the process ("terminate called").
        gc.collect()
        dist.destroy_process_group()


def log(message: str, on_rank: int = 0) -> None:
    rank = dist.get_rank() if dist.is_initialized() else env_rank()
    if rank == on_rank:
        say(message)


def say(line: str) -> None:
    # One write per line: with unbuffered output (python -u) print() writes the text and its
    # newline separately, and another rank's line sharing the launcher's stdout can land between.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def record_samples_per_step(samples: int) -> None:
    """Tell ranktrace's tracer, when it traces this script, how many samples each step trains on
    (the global batch); without the tracer it does nothing."""
    try:
        import tracer
    except ImportError:  # ranktrace is not installed: nothing traces this run
        return
    tracer.set_samples_per_step(samples)


def rank_path(path: str, rank: int) -> str:
    """``out.pt`` -> ``out.rank1.pt``: where each rank writes its own shard or stage."""
    p = Path(path)
    return str(p.with_name(f"{p.stem}.rank{rank}{p.suffix}"))


def save_results(path: str, losses: list[float], params: dict, **extra) -> None:
    """Plain tensors and dicts only, so ``torch.load(path, weights_only=True)`` reads it."""
    torch.save({"losses": torch.tensor(losses, dtype=torch.float64),
                "params": {name: t.detach().cpu().clone() for name, t in params.items()},
                **extra}, path)
