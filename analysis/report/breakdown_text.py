"""The time-breakdown tables of the text report: each rank's parts of its step time, with
communication shown as the rank's own transfer and waiting for peers (docs/definitions.md,
"Waiting for peers"), and the communication not split only where the split is unknown."""

from __future__ import annotations

import pandas as pd

from analysis.report.values import _ms, _pct, _rank, _share, plain, records


def split_known(table: pd.DataFrame | None) -> bool:
    """Whether every row of `table` has communication split into transfer and waiting."""
    return (table is not None and len(table) > 0
            and {"transfer_ns", "peer_wait_ns"} <= set(table.columns)
            and bool(table[["transfer_ns", "peer_wait_ns"]].notna().all().all()))


def comm_split(row: dict) -> tuple:
    """(transfer, waiting for peers, communication not split) of a breakdown row, ns: the
    cross-rank split of its communication-only time (docs/definitions.md, "Waiting for
    peers"); what no split covers (a step the pass has no waits for) stays unsplit."""
    comm = row.get("comm_only_ns")
    transfer, waiting = plain(row.get("transfer_ns")), plain(row.get("peer_wait_ns"))
    if comm is None:
        return transfer, waiting, None
    unsplit = comm - (transfer or 0.0) - (waiting or 0.0)
    return transfer, waiting, (unsplit if transfer is None or abs(unsplit) > 0.5 else 0.0)


UNSPLIT = "comm, not split"
SPLIT_NOTE = ("  transfer = the rank's own communication; waiting = waiting for peers in "
              "collectives (docs/definitions.md)")
UNSPLIT_NOTE = (f"; {UNSPLIT} = communication of steps without cross-rank waits, not told "
                f"apart")


def _with_split(rows: list[dict], split: list[tuple], show) -> tuple[list[dict], bool]:
    """The rows with transfer, waiting and (only where some row has any) the unsplit column,
    placed after compute; True where that column is shown."""
    unsplit_shown = any(u for _, _, u in split)
    out = []
    for row, (transfer, waiting, unsplit) in zip(rows, split):
        new = {}
        for key, value in row.items():
            new[key] = value
            if key == "compute":
                new["transfer"], new["waiting"] = show(transfer), show(waiting)
                if unsplit_shown:
                    new[UNSPLIT] = show(unsplit)
        out.append(new)
    return out, unsplit_shown


def split_note(unsplit_shown: bool) -> str:
    """The note under a table of split communication (and of communication not split)."""
    return SPLIT_NOTE + (UNSPLIT_NOTE if unsplit_shown else "")


def breakdown_text(totals: pd.DataFrame) -> pd.DataFrame:
    """Per rank, each part's share of its step time; communication shown as transfer and
    waiting for peers (and, where the split is unknown, communication not split)."""
    return breakdown_rows(totals)[0]


def breakdown_rows(totals: pd.DataFrame) -> tuple[pd.DataFrame, bool]:
    """(breakdown_text's table, whether it shows communication not split)."""
    rows, split = [], []
    for row in records(totals):
        whole = row["step_ns"]
        rows.append({
            "rank": _rank(row["rank"]), "kind": row["kind"], "steps": row["steps"],
            "mean step ms": _ms(whole / row["steps"] if row["steps"] else None),
            "total ms": _ms(whole),
            "compute": _share(row["compute_only_ns"], whole),
            "overlap": _share(row["overlap_ns"], whole),
            "memcpy": _share(row["memcpy_ns"], whole),
            "idle": _share(row["idle_ns"], whole),
            "comm hidden": _pct(row["overlap_pct"]),
        })
        split.append(comm_split(row))
    shown, unsplit = _with_split(rows, split, lambda v: v)
    wholes = [r["step_ns"] for r in records(totals)]
    for row, whole in zip(shown, wholes):
        for key in ("transfer", "waiting", UNSPLIT):
            if key in row:
                row[key] = _share(row[key], whole)
    return pd.DataFrame(shown), unsplit


def per_step_text(per_step: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, step), each part in ms; communication as transfer and waiting for peers."""
    return per_step_rows(per_step)[0]


def per_step_rows(per_step: pd.DataFrame) -> tuple[pd.DataFrame, bool]:
    """(per_step_text's table, whether it shows communication not split)."""
    rows, split = [], []
    for row in records(per_step):
        rows.append({
            "rank": _rank(row["rank"]), "step": row["step"], "step ms": _ms(row["step_ns"]),
            "compute": _ms(row["compute_only_ns"]),
            "overlap": _ms(row["overlap_ns"]), "memcpy": _ms(row["memcpy_ns"]),
            "idle": _ms(row["idle_ns"]), "hidden": _pct(row["overlap_pct"]),
        })
        split.append(comm_split(row))
    shown, unsplit = _with_split(rows, split, _ms)
    return pd.DataFrame(shown), unsplit
