"""The stop diagnosis of point-to-point ops: a send and its recv are the k-th send from rank S to
rank D and the k-th recv by D from S on one group (their IssueRecord positions, counted per group,
op and peer); per (group, S, D) the first k where one side never posted its op, the two disagree on
size or dtype, or neither completed (docs/reliability.md, Definitions).

Pure: DataFrame in, DataFrame out, rows in analysis.findings.stop_diagnosis's GROUP_COLUMNS plus
`src` and `dst`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core.comm_names import P2P_OPS
from analysis.findings.stop_text import clock_text, mbytes, ranks_text


def diagnose_p2p(ops: pd.DataFrame, dead: list[int], columns: list[str]) -> pd.DataFrame:
    """One row per (group, src, dst) whose sends and recvs stopped short; `dead`: ranks without
    run_end (their unflushed completions prove nothing, as for collectives)."""
    frame = ops[ops["op"].isin(P2P_OPS) & ops["peer"].notna()].copy()
    if "space" in frame:
        # Native send/recv (NCCL's, from C++) count positions over every peer of the group, so
        # send #k and recv #k need not be a pair: left out (the hooks see Python's send/recv).
        frame = frame[frame["space"].fillna("") == ""]
    out_columns = columns + ["src", "dst"]
    if frame.empty:
        return pd.DataFrame(columns=out_columns)
    frame.loc[frame["rank"].isin(dead), "completed"] = True
    sends = frame["op"] == "send"
    frame["src"] = np.where(sends, frame["rank"], frame["peer"]).astype(int)
    frame["dst"] = np.where(sends, frame["peer"], frame["rank"]).astype(int)
    rows = []
    for (pg, src, dst), pair in frame.groupby(["pg", "src", "dst"], sort=True):
        found = _first_unmatched(pair)
        if found is not None:
            rows.append({"pg": pg, "space": "", "src": int(src), "dst": int(dst),
                         "odd_ranks": [],
                         "dead_ranks": [r for r in dead if r in (src, dst)], **found})
    rows.sort(key=lambda row: row["waiting_since_ns"])
    result = pd.DataFrame(rows, columns=out_columns)
    result["text"] = [p2p_text(row) for row in result.to_dict("records")]
    return result


def _first_unmatched(pair: pd.DataFrame) -> dict | None:
    by_op = {op: rows.drop_duplicates("position").set_index("position")
             for op, rows in pair.groupby("op")}
    sends, recvs = by_op.get("send"), by_op.get("recv")
    positions = sorted(set(sends.index if sends is not None else [])
                       | set(recvs.index if recvs is not None else []))
    last_done = -1
    for position in positions:
        send = sends.loc[position] if sends is not None and position in sends.index else None
        recv = recvs.loc[position] if recvs is not None and position in recvs.index else None
        posted = [(op, row) for op, row in (("send", send), ("recv", recv)) if row is not None]
        if len(posted) == 1:
            kind = "missing"
        elif (send["bytes"], send["dtype"]) != (recv["bytes"], recv["dtype"]):
            kind = "mismatch"
        elif not (send["completed"] and recv["completed"]):
            kind = "not_completed"
        else:
            last_done = int(position)
            continue
        first_op, first = posted[0]
        issued = sorted(int(row["rank"]) for _, row in posted)
        src, dst = int(pair["src"].iloc[0]), int(pair["dst"].iloc[0])
        return {"kind": kind, "position": int(position), "op": first_op,
                "bytes": first["bytes"], "dtype": first["dtype"],
                "last_completed_position": last_done, "issued_ranks": issued,
                "missing_ranks": [r for r in (src, dst) if r not in issued],
                "waiting_since_ns": int(min(row["issue_ns"] for _, row in posted)),
                "signatures": "; ".join(f"{op} {mbytes(row['bytes'])} {row['dtype']} on rank "
                                        f"{int(row['rank'])}" for op, row in posted)}
    return None


def p2p_text(row: dict) -> str:
    src, dst, position, pg = row["src"], row["dst"], row["position"], row["pg"]
    since = clock_text(row["waiting_since_ns"])
    last = (f"#{row['last_completed_position']}" if row["last_completed_position"] >= 0
            else "none")
    if row["kind"] == "missing" and row["op"] == "send":
        text = (f"rank {dst} never posted recv #{position} from rank {src} on group {pg}, "
                f"for rank {src}'s send ({mbytes(row['bytes'])} {row['dtype']}) waiting from "
                f"{since}")
    elif row["kind"] == "missing":
        text = (f"rank {src} never posted send #{position} to rank {dst} on group {pg}, "
                f"for rank {dst}'s recv ({mbytes(row['bytes'])} {row['dtype']}) waiting from "
                f"{since}")
    elif row["kind"] == "mismatch":
        text = (f"send/recv #{position} rank {src} -> rank {dst} on group {pg} disagree: "
                f"{row['signatures']} (from {since})")
    else:
        text = (f"send/recv #{position} rank {src} -> rank {dst} on group {pg} "
                f"({mbytes(row['bytes'])} {row['dtype']}) was posted by both from {since} and "
                f"never completed")
    if row["dead_ranks"]:
        text += f"; {ranks_text(row['dead_ranks'])} died (no run_end)"
    return text + f"; last pair both completed: {last}"
