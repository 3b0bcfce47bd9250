"""A trace of many events and a fixture that cuts files into chunks of a few kB."""


from helpers.synthetic import TraceBuilder


def many_events_trace() -> dict:
    b = TraceBuilder(rank=3, world_size=4)
    for n in range(1, 41):
        t = n * 100
        b.step(n, t, t + 100).compute(t + 10, t + 50).nccl(t + 40, t + 70)
        b.op("aten::mm", t + 1, t + 9, args={"Input Dims": [[4, 4], [4, 4]]})
    return b.document()
