"""What one read of torch's Flight Recorder costs, by how many entries its ring holds.

    .venv/bin/python benchmarks/overhead_flight_dump.py [--repeats 15] [--fills 64 256 1024 4096]

One process, a gloo group of one rank: the ring (TORCH_FR_BUFFER_SIZE = the largest fill) is
filled with small all-reduces to each fill in turn, then dumped and decoded as the tracer's
Flight Recorder part does (`_dump_fr_trace_json`, msgspec into its FrDump), `--repeats` times.
The dump holds the GIL while it builds its JSON, and the decode holds it too, so their time is
the most a training thread that wants the GIL can wait per drain. Printed per fill: median
(min, max) of the dump and of the decode, per entry, and what share of the wall time that is at
the part's pacing
(tracer.comms.flight: no more often than the dump's time / COST_SHARE, at least every
MAX_INTERVAL_S).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--fills", type=int, nargs="+", default=[64, 256, 1024, 4096])
    args = p.parse_args()
    fills = sorted(args.fills)
    os.environ["TORCH_FR_BUFFER_SIZE"] = str(fills[-1])
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    import msgspec
    import torch
    import torch.distributed as dist

    from tracer.comms import flight
    from tracer.comms.flight_entries import FrDump

    dist.init_process_group("gloo", rank=0, world_size=1)
    dump = torch._C._distributed_c10d._dump_fr_trace_json
    decoder = msgspec.json.Decoder(FrDump)
    x = torch.ones(16)
    issued = 0
    print(f"# torch {torch.__version__}, ring of {fills[-1]} entries, {args.repeats} repeats, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'entries':>8} {'dump ms':>24} {'decode ms':>24} {'us/entry':>9} "
          f"{'interval s':>10} {'share':>7}")
    for fill in fills:
        while issued < fill:
            dist.all_reduce(x)
            issued += 1
        dumps, decodes = [], []
        for _ in range(args.repeats):
            started = time.perf_counter()
            raw = dump(includeCollectives=True, onlyActive=False)
            dumped = time.perf_counter()
            decoded = decoder.decode(raw)
            dumps.append(dumped - started)
            decodes.append(time.perf_counter() - dumped)
        assert len(decoded.entries) == fill
        d, c = statistics.median(dumps), statistics.median(decodes)
        interval = min(flight.MAX_INTERVAL_S, max(flight.MIN_INTERVAL_S,
                                                  (d + c) / flight.COST_SHARE))
        print(f"{fill:>8} {d * 1e3:8.3f} ({min(dumps) * 1e3:6.3f}-{max(dumps) * 1e3:7.3f})"
              f" {c * 1e3:8.3f} ({min(decodes) * 1e3:6.3f}-{max(decodes) * 1e3:7.3f})"
              f" {(d + c) / fill * 1e6:9.2f} {interval:10.2f} {(d + c) / interval * 100:6.2f}%")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
