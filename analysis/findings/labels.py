"""What the findings' texts share: rank lists, ms, the labels of collective groups, the run's
kind (analysis.findings.bottlenecks, .resources, .notes)."""

from __future__ import annotations

import math

import pandas as pd

from analysis.core.comm_names import UNKNOWN_PG
from analysis.core.step_spec import format_ranges
from analysis.rank import issuers
from analysis.rank.comm.comm_ops import UNKNOWN_BUCKET


def rank_list(ranks) -> str:
    """Ranks as ranges: [0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8"."""
    return format_ranges(sorted({int(r) for r in ranks if r is not None and not pd.isna(r)}))


def ms(ns) -> str:
    return f"{ns / 1e6:.2f} ms"


def collective_text(row: dict) -> str:
    busbw = row.get("busbw_gbps", float("nan"))
    bandwidth = f", busbw {busbw:.2f} GB/s" if finite(busbw) else ""
    return (f"{group_label(row)} x{int(row.get('count', 0))} {row['total_us'] / 1e3:.2f} ms "
            f"({row['time_share'] * 100:.0f}% of comm time{bandwidth})")


_ISSUER_TEXT = {"ddp": "DDP", "fsdp1": "FSDP", "fsdp2": "FSDP2", "functional": "functional",
                "p2p": "p2p", "c10d": "torch.distributed"}


def issuer_of(row) -> str:
    issuer = row.get("issuer") if hasattr(row, "get") else None
    return issuer if isinstance(issuer, str) else issuers.UNKNOWN


def group_label(row: dict) -> str:
    """"DDP all_reduce on mesh_dp (1) 16-32 MiB"; "pg ?" and "size ?" where the trace did not
    say; the issuer is left out where it is unknown."""
    pg = row.get("pg")
    bucket = row.get("size_bucket")
    pg_id = row.get("pg_id")
    if pg is None or pg == UNKNOWN_PG or pd.isna(pg):
        pg_text = "pg ?"
    elif isinstance(pg_id, str) and pg != pg_id and pg.endswith(f"({pg_id})"):
        pg_text = f"on {pg[:-len(pg_id) - 2]}(pg {pg_id})"  # "on mesh_dp (pg 1)"
    else:
        pg_text = f"pg {pg}"
    unknown = bucket is None or bucket == UNKNOWN_BUCKET or pd.isna(bucket)
    size_text = "size ?" if unknown else bucket
    issuer = _ISSUER_TEXT.get(issuer_of(row))
    return f"{issuer + ' ' if issuer else ''}{row['op']} {pg_text} {size_text}"


def finite(value) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False



def run_kind(per_rank: pd.DataFrame, traces) -> str:
    """"gpu" (NCCL expectations) or "cpu" (gloo): the traces' backend, else the breakdown's kind."""
    backends = {str(getattr(t, "backend", None) or "").lower() for t in traces or []} - {""}
    if backends & {"nccl", "rccl"}:
        return "gpu"
    if backends:
        return "cpu"
    if not per_rank.empty and "kind" in per_rank.columns and (per_rank["kind"] == "gpu").any():
        return "gpu"
    return "cpu"


def backend_text(kind: str) -> str:
    return "NCCL on GPUs" if kind == "gpu" else "gloo on CPUs"

