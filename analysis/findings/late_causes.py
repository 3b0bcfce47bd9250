"""Why a rank is late: each cause tested against the evidence of a set of steps, in order, and
those that hold named with their proof, a confidence and the advice that fits them
(docs/report.md, "Why a rank is late", gives each test, threshold and reason).

`late_causes(rank, steps, evidence, late_ms)` tests one late rank over the steps given (a
phase's, or every analysed step), on the evidence gathered once per run
(analysis.findings.late_evidence). The causes, in the order they are tested:

1. larger inputs: the same ops, with other input shapes, take R longer;
2. slower at equal inputs: the same ops with the same shapes take R longer; then why:
   competition for cores, device throttling, a different device or host (or none known);
3. data loading: R spends longer in the DataLoader's next batch;
4. work only R does: host ops that no other rank runs, or host time outside every op while R's
   process keeps a core busy;
5. waiting outside the trace: host time outside every op while R's process is idle, where no
   other cause holds.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.findings.late_evidence import LateEvidence

# ---- the causes, as named in the report ---------------------------------------------------------
LARGER_INPUTS = "larger inputs"
SLOWER = "slower at equal inputs"
CONTENTION = "competition for cores"
THROTTLING = "device throttling"
OTHER_HARDWARE = "a different device or host"
DATA_LOADING = "data loading"
OWN_WORK = "work only this rank does"
OUTSIDE = "waiting outside the trace"
HIGH, MEDIUM, LOW = "high", "medium", "low"

# ---- thresholds (docs/report.md, "Why a rank is late") ------------------------------------------
# A cause holds only where it explains at least this share of R's mean step in the steps tested.
MIN_EXPLAINED_PCT = 5.0
# ... and it is held with high confidence where it explains at least this share of R's lateness.
HIGH_SHARE_OF_LATE = 0.5
SLOWER_RATIO = 1.2  # R's time in the same ops with the same shapes, over the others'
# The host's CPUs this busy (the sampler's cpu_system_pct, median over the steps): the ranks
# compete for cores; the scaling study reads the same rule (analysis.scaling).
SATURATED_CPU_PCT = 90.0
THROTTLED_CLOCK_RATIO = 0.9  # R's median SM clock at most this share of the others' median
BUSY_PROCESS_PCT = 50.0  # on a GPU trace, R's process keeps half a core busy (100 = one core)
BUSIER_BY_PCT = 10.0  # ... or this many points more than the others' processes (median)
# On a CPU trace: R's process CPU time per step above the others' over its extra time outside
# every op. A busy loop of 25 ms gave 26 ms; a clean run's rank held off its core by another
# process on a 2-core host gave 2 ms of CPU for 4 ms outside the ops.
OWN_CPU_SHARE = 0.75
MORE_WORK_RATIO = 1.2  # a pipeline stage's work priced at the ranks' common speed, over others'


def cores_compete(host_cpu_pct: float) -> bool:
    """Whether a host's CPUs this busy (median %, 100 = all cores) mean the ranks compete for
    cores: SATURATED_CPU_PCT."""
    return bool(host_cpu_pct >= SATURATED_CPU_PCT)


def contention_text(host_cpu_pct: float) -> str:
    """The words of the contention rule, for the breakdown and the scaling study alike."""
    return (f"the host's CPUs were {host_cpu_pct:.0f}% busy: the ranks compete for cores "
            f"(more ranks than cores oversubscribe the host)")


@dataclass(frozen=True)
class Cause:
    """One cause that holds for a late rank: `proof` in numbers, the late time per step it
    explains (`explains_ms`, NaN where it cannot be measured) and the advice that fits it."""

    rank: int
    cause: str
    confidence: str
    proof: str
    advice: str
    explains_ms: float = math.nan

    def row(self) -> dict:
        return {"rank": self.rank, "cause": self.cause, "confidence": self.confidence,
                "proof": self.proof, "advice": self.advice,
                "explains_ms_per_step": None if math.isnan(self.explains_ms)
                else round(self.explains_ms, 3)}


ADVICE = {
    LARGER_INPUTS: "Balance the shards: give every rank the same amount of data per step "
                   "(equal batch per rank, DistributedSampler with drop_last=True), and pad or "
                   "bucket samples by length so that each rank's batch holds the same tokens.",
    CONTENTION: "Stop the ranks competing for cores: run fewer ranks per host (or fewer threads "
                "per rank, OMP_NUM_THREADS), pin each rank to its own cores (taskset or numactl "
                "per rank), and find the other processes "
                "busy on the host (top, ps).",
    THROTTLING: "Check the device's cooling and power cap (nvidia-smi -q -d "
                "PERFORMANCE,POWER,TEMPERATURE: clocks throttle reasons, power limit, "
                "temperature); reset a lowered power limit or move the job off a hot device.",
    OTHER_HARDWARE: "Give every rank the same kind of device and host, or give the slower one "
                    "less work (a smaller shard).",
    DATA_LOADING: "Load its data faster: raise DataLoader num_workers, set pin_memory=True, "
                  "persistent_workers=True and a larger prefetch_factor; check its storage.",
    OWN_WORK: "Move the work only this rank does (logging, evaluation, checkpointing, metrics) "
              "off the training step, run it less often or spread it over the ranks.",
    OUTSIDE: "Find what the rank waits on outside torch (file or network I/O, a lock, a sleep, "
             "the Python interpreter): sample its stack during a step (py-spy dump).",
    SLOWER: "Compare its host and device with the others' (CPU frequency, other processes, "
            "core pinning; device clocks and temperature).",
}


def _ms(ns: float) -> float:
    return float(ns) / 1e6


def _rank_text(ranks) -> str:
    ranks = sorted(int(r) for r in ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def _per_step(frame: pd.DataFrame, value: str) -> pd.Series:
    """Per rank: the mean over its steps of `value` summed per step."""
    if frame.empty:
        return pd.Series(dtype="float64")
    summed = frame.groupby(["rank", "step"])[value].sum()
    return summed.groupby(level="rank").mean()


def _typical_per_step(host: pd.DataFrame, column: str) -> pd.Series:
    """Per rank: the median over its steps of `column` (a host time per step). A cause of the
    rank's holds in most of its steps; one step the scheduler stretched on a shared host (a
    descheduled DataLoader, 3 ms where the others' take 0.7) is not a cause of it."""
    if host.empty:
        return pd.Series(dtype="float64")
    return host.groupby("rank")[column].median()


def _confidence(explains_ms: float, late_ms: float | None) -> str:
    """HIGH where a cause explains at least HIGH_SHARE_OF_LATE of the rank's lateness."""
    return HIGH if late_ms and explains_ms >= HIGH_SHARE_OF_LATE * late_ms else MEDIUM


def _on_device(ops: pd.DataFrame) -> bool:
    """Whether `ops` hold device kernels: a GPU trace."""
    return bool(len(ops)) and bool(ops["device"].astype(bool).any())


def _compared_ops(ops: pd.DataFrame) -> pd.DataFrame:
    """The ops whose times are compared across ranks: on a GPU trace the compute kernels (by
    name: a host op's time there is its launch), else the host ops."""
    return ops[ops["device"].astype(bool)] if _on_device(ops) else ops


def _robust_per_step(ops: pd.DataFrame) -> pd.Series:
    """Per rank: its time per step in `ops`, each op name and shapes at its median time on that
    rank (one op slowed by a burst of other work does not count as many)."""
    if ops.empty:
        return pd.Series(dtype="float64")
    keyed = ops.assign(key=ops["name"].astype(str) + " " + ops["dims"].astype(str))
    median = keyed.groupby(["rank", "key"])["dur_ns"].transform("median")
    return _per_step(keyed.assign(robust=median), "robust")


def _structure(dims: str):
    try:
        parsed = json.loads(dims)
    except ValueError:
        return None
    return tuple(len(d) if isinstance(d, list) else -1 for d in parsed), parsed


def _closest(mine: str, theirs: pd.Series) -> tuple[str | None, int]:
    """Of the others' shapes of an op (`theirs`, one per op), those with the same inputs of the
    same ranks as `mine` that differ in the fewest dimensions (the most frequent of them), and
    how many dimensions differ."""
    own = _structure(mine)
    if own is None:
        return None, 0
    best, fewest = None, 0
    for dims, _count in theirs.value_counts().items():
        other = _structure(dims)
        if other is None or other[0] != own[0]:
            continue
        differing = sum(p != q for x, y in zip(own[1], other[1])
                        if isinstance(x, list) and isinstance(y, list) for p, q in zip(x, y))
        if best is None or differing < fewest:
            best, fewest = dims, differing
    return best, fewest


def _shape_difference(mine: str, theirs: str) -> tuple[str, float | None]:
    """Which dimensions differ between two `Input Dims` texts of one op (those of its first
    input that differs), and that input's size ratio."""
    a, b = json.loads(mine), json.loads(theirs)
    for i, (x, y) in enumerate(zip(a, b)):
        if isinstance(x, list) and isinstance(y, list) and x != y:
            parts = [f"dimension {d} of input {i}: {p} against {q}"
                     + (f" ({p / q:.1f}x)" if q else "")
                     for d, (p, q) in enumerate(zip(x, y)) if p != q]
            size = math.prod(y)
            return "; ".join(parts), (math.prod(x) / size if size else None)
    return "", None


def larger_inputs(rank: int, ops: pd.DataFrame, step_ms: float, late_ms: float | None
                  ) -> Cause | None:
    """The same ops (by name) with other input shapes on R than on the others, and R's time in
    them above the others' by MIN_EXPLAINED_PCT of its step."""
    host = ops[~ops["device"].astype(bool)]
    mine, others = host[host["rank"] == rank], host[host["rank"] != rank]
    if mine.empty or others.empty:
        return None
    their_dims = others.groupby("name")["dims"].agg(set)
    shared = mine[mine["name"].isin(their_dims.index)]
    differ = shared[[d not in their_dims[n] for n, d in zip(shared["name"], shared["dims"])]]
    if differ.empty:
        return None
    names = set(differ["name"])
    theirs = _robust_per_step(others[others["name"].isin(names)])
    extra = _robust_per_step(mine[mine["name"].isin(names)]).get(rank, 0.0) - float(
        theirs.median())
    if not _ms(extra) >= MIN_EXPLAINED_PCT / 100 * step_ms:
        return None
    # The op whose shapes differ from the others' closest in the fewest dimensions (the
    # clearest statement of which dimension differs), the most time first.
    timed = differ.groupby(["name", "dims"])["dur_ns"].agg(lambda d: d.median() * len(d))
    pairs = [(name, dims, *_closest(dims, others.loc[others["name"] == name, "dims"]))
             for name, dims in timed.sort_values(ascending=False).index]
    # Only inputs larger than the others' explain a late rank (a pipeline's last stage has its
    # head's smaller shapes).
    pairs = [(*p, *_shape_difference(p[1], p[2])) for p in pairs if p[2] is not None]
    pairs = [p for p in pairs if p[5] is not None and p[5] > 1]
    if not pairs:
        return None
    name, dims, common, _, what, size = min(pairs, key=lambda p: p[3])
    proof = (f"rank {rank}'s {name} takes inputs {dims} where "
             f"{_rank_text(others['rank'].unique())} {_verb(others)} {common}"
             + (f" ({what}" + (f": {size:.1f}x the elements)" if size else ")") if what else "")
             + f"; its ops of other shapes ({len(names)} op name(s)) take {_ms(extra):.2f} ms "
               f"per step more than the others'.")
    return Cause(rank, LARGER_INPUTS, _confidence(_ms(extra), late_ms), proof,
                 ADVICE[LARGER_INPUTS], _ms(extra))


def slower_at_equal_inputs(rank: int, ops: pd.DataFrame, step_ms: float
                           ) -> tuple[float, float] | None:
    """(R's time over the others' in the same ops with the same shapes, R's extra ms per step)
    where R is SLOWER_RATIO slower and the extra time is MIN_EXPLAINED_PCT of its step; None
    otherwise. Each op name and shapes at its median time on R and on the others. On GPU traces
    the compute kernels by name are compared, else the host ops."""
    chosen = _compared_ops(ops)
    keys = chosen["name"].astype(str) + " " + chosen["dims"].astype(str)
    chosen = chosen.assign(key=keys)
    mine, others = chosen[chosen["rank"] == rank], chosen[chosen["rank"] != rank]
    if mine.empty or others.empty:
        return None
    theirs = others.groupby("key")["dur_ns"].median()
    equal = mine[mine["key"].isin(theirs.index)]
    if equal.empty:
        return None
    counts = equal.groupby("key").size()
    own = float((equal.groupby("key")["dur_ns"].median() * counts).sum())
    at_their_speed = float((theirs.reindex(counts.index) * counts).sum())
    steps = max(equal["step"].nunique(), 1)
    extra = (own - at_their_speed) / steps
    ratio = own / at_their_speed if at_their_speed > 0 else math.nan
    if not (ratio >= SLOWER_RATIO and _ms(extra) >= MIN_EXPLAINED_PCT / 100 * step_ms):
        return None
    return ratio, _ms(extra)


def _median(frame: pd.DataFrame, column: str) -> float:
    values = pd.to_numeric(frame[column], errors="coerce").dropna() if column in frame else []
    return float(np.median(values)) if len(values) else math.nan


def contention(rank: int, evidence: LateEvidence, samples: pd.DataFrame
               ) -> tuple[str, bool] | None:
    """Why the ranks on R's host compete for cores, in words, and whether the host is
    oversubscribed: its CPUs saturated (the sampler's host CPU, median over the steps) or more
    ranks on it than CPUs each may use (the manifests); None where neither is seen."""
    ranks = evidence.ranks.set_index("rank") if len(evidence.ranks) else pd.DataFrame()
    row = ranks.loc[rank] if rank in ranks.index else None
    host_cpu = _median(samples[samples["rank"] == rank], "cpu_system_pct")
    on_host = (int((ranks["host"] == row["host"]).sum())
               if row is not None and row["host"] is not None else None)
    cpus = row["cpus"] if row is not None and pd.notna(row["cpus"]) else None
    parts = []
    if not math.isnan(host_cpu) and cores_compete(host_cpu):
        parts.append(contention_text(host_cpu))
    oversubscribed = on_host is not None and cpus is not None and on_host > int(cpus)
    if oversubscribed:
        parts.append(f"{on_host} ranks share host {row['host']}, where each may use "
                     f"{int(cpus)} CPUs")
    return ("; ".join(parts), oversubscribed) if parts else None


def _throttled(rank: int, samples: pd.DataFrame) -> str | None:
    """R's SM clock below the others' (the NVML samples), with power and temperature, in words."""
    mine, others = samples[samples["rank"] == rank], samples[samples["rank"] != rank]
    clock, their_clock = _median(mine, "sm_clock_mhz"), _median(others, "sm_clock_mhz")
    if math.isnan(clock) or not their_clock > 0 or clock > THROTTLED_CLOCK_RATIO * their_clock:
        return None
    hotter = [f"{name} {_median(mine, column):.0f} {unit} against {_median(others, column):.0f}"
              for name, column, unit in (("power", "power_w", "W"), ("temperature", "temp_c", "C"))
              if not (math.isnan(_median(mine, column)) or math.isnan(_median(others, column)))]
    return (f"its SM clock runs at {clock:.0f} MHz against the others' {their_clock:.0f} MHz "
            f"(medians of the NVML samples)" + ("; " + ", ".join(hotter) if hotter else ""))


def _other_hardware(rank: int, evidence: LateEvidence) -> tuple[str, bool] | None:
    """(R's device or host against the others', whether it is the device) where R's differs."""
    ranks = evidence.ranks.set_index("rank") if len(evidence.ranks) else pd.DataFrame()
    if rank not in ranks.index or len(ranks) < 2:
        return None
    row, others = ranks.loc[rank], ranks.drop(index=rank)
    if row["device"] is not None and row["device"] not in set(others["device"]):
        return (f"its device is {row['device']}, the others' "
                f"{', '.join(sorted(set(map(str, others['device']))))}", True)
    if (row["host"] is not None and row["host"] not in set(others["host"])
            and others["host"].nunique() == 1):
        return f"it alone runs on host {row['host']}, the others on {others['host'].iloc[0]}", False
    return None


def why_slower(rank: int, evidence: LateEvidence, samples: pd.DataFrame, ratio: float,
               extra_ms: float, late_ms: float | None) -> list[Cause]:
    """The causes of R's slowness at equal inputs that the host, device and samples show (or
    SLOWER alone, with low confidence, where none does)."""
    said = (f"rank {rank}'s ops with the same input shapes as the others' take {ratio:.2f}x "
            f"their time ({extra_ms:.2f} ms per step more)")
    much = late_ms is None or extra_ms >= HIGH_SHARE_OF_LATE * late_ms
    causes = []
    competing = contention(rank, evidence, samples)
    if competing:
        causes.append(Cause(rank, CONTENTION, HIGH if much else MEDIUM,
                            f"{said}; {competing[0]}.", ADVICE[CONTENTION], extra_ms))
    throttled = _throttled(rank, samples)
    if throttled:
        causes.append(Cause(rank, THROTTLING, HIGH if much else MEDIUM, f"{said}; {throttled}.",
                            ADVICE[THROTTLING], extra_ms))
    hardware = _other_hardware(rank, evidence)
    if hardware:
        causes.append(Cause(rank, OTHER_HARDWARE, HIGH if hardware[1] else MEDIUM,
                            f"{said}; {hardware[0]}.", ADVICE[OTHER_HARDWARE], extra_ms))
    if not causes:
        causes.append(Cause(rank, SLOWER, LOW, f"{said}; neither the samples nor the manifests "
                            f"say why (no saturated CPUs, no lower clock, the same device and "
                            f"host).", ADVICE[SLOWER], extra_ms))
    return causes


def _needed(step_ms: float, late_ms: float | None, stretched: bool) -> float:
    """The ms per step a host-time cause must explain: MIN_EXPLAINED_PCT of R's step; where the
    scheduler may have `stretched` R's host time (its DataLoader's, its Python's), also
    HIGH_SHARE_OF_LATE of R's lateness: on a host whose ranks compete for cores, and for a rank
    late only on average, which no rule named (a shared host's scheduler gives some rank of a
    clean run that lateness, and a millisecond more of host time besides)."""
    needed = MIN_EXPLAINED_PCT / 100 * step_ms
    return max(needed, HIGH_SHARE_OF_LATE * late_ms) if stretched and late_ms else needed


def data_loading(rank: int, host: pd.DataFrame, step_ms: float, late_ms: float | None,
                 stretched: bool = False) -> Cause | None:
    """R's time in the DataLoader's next batch above the others' median (_needed), each rank's
    at its median over the steps."""
    per = _typical_per_step(host, "loading_ns")
    if rank not in per.index or len(per) < 2:
        return None
    theirs = float(per.drop(index=rank).median())
    extra = _ms(per[rank] - theirs)
    if not extra >= _needed(step_ms, late_ms, stretched):
        return None
    proof = (f"rank {rank} spends {_ms(per[rank]):.2f} ms per step in the DataLoader's next "
             f"batch, the others {_ms(theirs):.2f} ms (medians over the steps).")
    return Cause(rank, DATA_LOADING, _confidence(extra, late_ms), proof, ADVICE[DATA_LOADING],
                 extra)


def own_work(rank: int, evidence: LateEvidence, host: pd.DataFrame, names: pd.DataFrame,
             samples: pd.DataFrame, step_ms: float, stage: bool = False,
             outside_needed: float | None = None, late_ms: float | None = None
             ) -> tuple[Cause | None, Cause | None]:
    """(work only R does, waiting outside the trace): host op names only R runs (not for a
    pipeline `stage`, whose stages run different ops by design: more_work compares them); R's
    time outside every op above the others' (each rank's at its median over the steps), told
    apart by R's process CPU."""
    threshold = MIN_EXPLAINED_PCT / 100 * step_ms
    own = None
    mine, others = names[names["rank"] == rank], names[names["rank"] != rank]
    if len(mine) and len(others) and not stage:
        alone = mine[~mine["name"].isin(set(others["name"]))]
        steps = max(mine["step"].nunique(), 1)
        per_name = alone.groupby("name")["dur_ns"].sum() / steps
        if _ms(per_name.sum()) >= threshold:
            listed = ", ".join(f"{n} {_ms(t):.2f} ms" for n, t in
                               per_name.sort_values(ascending=False).head(3).items())
            own = Cause(rank, OWN_WORK, _confidence(_ms(per_name.sum()), late_ms),
                        f"rank {rank} runs host ops no other rank runs, "
                        f"per step: {listed}.", ADVICE[OWN_WORK], _ms(per_name.sum()))
    per = _typical_per_step(host, "outside_ns")
    if rank not in per.index or len(per) < 2:
        return own, None
    theirs = float(per.drop(index=rank).median())
    extra = _ms(per[rank] - theirs)
    if not extra >= (outside_needed or threshold):
        return own, None
    said = (f"rank {rank} spends {_ms(per[rank]):.2f} ms per step outside every op, the others "
            f"{_ms(theirs):.2f} ms (medians over the steps)")
    busy, how = _busy_outside(rank, host, samples, extra, _on_device(evidence.ops))
    if busy:
        return own or Cause(rank, OWN_WORK, _confidence(extra, late_ms),
                            f"{said}, while {how}: host work in Python only it does.",
                            ADVICE[OWN_WORK], extra), None
    return own, Cause(rank, OUTSIDE, LOW, f"{said}{', while ' + how if how else ''}.",
                      ADVICE[OUTSIDE], extra)


def _busy_outside(rank: int, host: pd.DataFrame, samples: pd.DataFrame, extra_ms: float,
                  on_device: bool) -> tuple[bool, str]:
    """Whether R's `extra_ms` per step outside every op is spent working (its process busy) or
    waiting, and the samples that say so, in words ("" without samples). On a CPU trace the
    ops keep cores busy, so every training process is over half a core: R's process CPU time
    per step must exceed the others' by OWN_CPU_SHARE of the extra time (a busy loop costs its
    time in CPU; a rank the scheduler held off its core, or one blocked on I/O, costs none). On
    a GPU trace a rank's host is its one Python thread: half a core or more, or well above the
    others' (a starved host gives none a core)."""
    process = _median(samples[samples["rank"] == rank], "cpu_process_pct")
    their_process = _median(samples[samples["rank"] != rank], "cpu_process_pct")
    if math.isnan(process):
        return False, ""
    if on_device:
        busy = process >= BUSY_PROCESS_PCT or (
            not math.isnan(their_process) and process >= their_process + BUSIER_BY_PCT)
        theirs = ("" if math.isnan(their_process) else
                  f" (the others' {their_process:.0f}%)")
        return busy, (f"its process keeps {process:.0f}% of a core busy{theirs}" if busy else
                      f"its process uses {process:.0f}% of a core (idle, waiting)")
    step_ms = host.groupby("rank")["step_ns"].mean() / 1e6
    pct = pd.to_numeric(samples["cpu_process_pct"], errors="coerce")
    cpu_ms = (pct.groupby(samples["rank"]).median() / 100 * step_ms).dropna()
    if rank not in cpu_ms.index or len(cpu_ms) < 2:
        return False, f"its process uses {process:.0f}% of a core"
    more = float(cpu_ms[rank] - cpu_ms.drop(index=rank).median())
    words = (f"its process uses {more:.2f} ms of CPU per step more than the others' "
             f"({process:.0f}% of a core against {their_process:.0f}%)")
    return more >= OWN_CPU_SHARE * extra_ms, words


def late_causes(rank: int, steps, evidence: LateEvidence, late_ms: float | None = None,
                by_elimination: bool = True, stage: bool = False) -> list[Cause]:
    """The causes that hold for `rank` over `steps` (step numbers; the traced ones among them
    give the ops and host time, the recorded ones the samples), each with its proof; `late_ms`
    is R's lateness per step (what the others wait for it), for the confidence. Without
    `by_elimination` (a rank late only on average), the causes named only because no other
    holds (competition for cores with every rank slowed alike, waiting outside the trace) are
    not tested, and R's host time counts only where it explains half its lateness (_needed); a
    pipeline `stage` is not blamed for the ops that only its stage runs."""
    chosen = set(int(s) for s in steps)

    def of(frame: pd.DataFrame) -> pd.DataFrame:
        return frame[frame["step"].astype("int64").isin(chosen)] if len(frame) else frame

    ops, host, names, samples = (of(evidence.ops), of(evidence.host), of(evidence.names),
                                 of(evidence.samples))
    mine = host[host["rank"] == rank]
    if mine.empty:
        return []
    step_ms = _ms(mine["step_ns"].mean())
    causes = []
    larger = larger_inputs(rank, ops, step_ms, late_ms) if len(ops) else None
    if larger is not None:
        causes.append(larger)
    slower = slower_at_equal_inputs(rank, ops, step_ms) if len(ops) else None
    if slower is not None:
        causes += why_slower(rank, evidence, samples, *slower, late_ms)
    competing = contention(rank, evidence, samples)
    stretched = competing is not None or not by_elimination
    loading = data_loading(rank, host, step_ms, late_ms, stretched)
    if loading is not None:
        causes.append(loading)
    own, outside = own_work(rank, evidence, host, names, samples, step_ms, stage,
                            _needed(step_ms, late_ms, stretched), late_ms)
    if own is not None:
        causes.append(own)
    if not by_elimination or any(c.cause == CONTENTION for c in causes):
        return causes
    work = more_work(rank, steps, evidence)
    alike = ((work is None or work < MORE_WORK_RATIO) and slower is None)
    # More ranks than CPUs slow every rank, whatever else holds; saturated CPUs alone explain
    # a late rank only where nothing else does.
    if competing and causes and competing[1]:
        # Another cause holds: the shared cores slow every rank on the host besides.
        causes.append(Cause(rank, CONTENTION, MEDIUM, f"{competing[0]}: every rank on the host "
                            f"is slowed besides.", ADVICE[CONTENTION]))
    elif competing and not causes and alike:
        # Every rank starved alike: which one arrives last is the scheduler's pick.
        causes.append(Cause(
            rank, CONTENTION, HIGH if competing[1] else MEDIUM,
            f"{competing[0]}; rank {rank} does no more work than the others and is not slower "
            f"at equal inputs than they are: every rank is slowed alike, and which one arrives "
            f"last is the scheduler's pick.", ADVICE[CONTENTION]))
    elif outside is not None and not causes:
        causes.append(outside)
    return causes


def more_work(rank: int, steps, evidence: LateEvidence) -> float | None:
    """A pipeline stage's compute work per step over the other stages' median, its ops priced at
    the ranks' common speed (each op name and shapes at the median time over every rank): above
    MORE_WORK_RATIO the stage has more work. None without ops on R and another rank."""
    ops = evidence.ops
    ops = ops[ops["step"].astype("int64").isin(set(int(s) for s in steps))] if len(ops) else ops
    if ops.empty or ops["rank"].nunique() < 2 or rank not in set(ops["rank"]):
        return None
    chosen = _compared_ops(ops)
    keyed = chosen.assign(key=chosen["name"].astype(str) + " " + chosen["dims"].astype(str))
    price = keyed.groupby("key")["dur_ns"].median()
    work = keyed.assign(priced=keyed["key"].map(price))
    per = _per_step(work, "priced")
    if rank not in per.index or len(per) < 2:
        return None
    theirs = float(per.drop(index=rank).median())
    return float(per[rank] / theirs) if theirs > 0 else None


def _verb(others: pd.DataFrame) -> str:
    return "takes" if others["rank"].nunique() == 1 else "take"
