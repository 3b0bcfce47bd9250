"""Matching each collective and p2p op across the members of its process group.

Collectives are matched by their position in the group's order within a step (every member
issues a group's collectives in the same order); p2p by (group, src, dst, step, order).
A position where members disagree on op, size or dtype, or where a member never issued it, is a
mismatch (docs/cross-rank.md). Everything here is vectorised: groupby, merge, cumcount.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.crossrank.frames import P2P_OPS
from analysis.steps import format_ranges

MISMATCH_COLUMNS = ["pg", "step", "position", "problem", "ranks", "missing_ranks"]
KEY = ["pg", "step", "position"]
# Each member of an all_to_all sends its own split sizes: its bytes may differ between members.
SIZES_MAY_DIFFER = ("all_to_all",)
# Beyond this many (group, rank, step) cells, missing members are found by merges instead.
_MAX_MEMBERSHIP_CELLS = 20_000_000


def group_members(ops: pd.DataFrame, world_size: int) -> pd.DataFrame:
    """(pg, rank) of every member: the whole world for a group as large as it, else the ranks
    that issued anything on the group (a group is created on all ranks, used by its members)."""
    collectives = ops[~ops["op"].isin(P2P_OPS)]
    seen = collectives[["pg", "rank"]].drop_duplicates()
    sizes = collectives.groupby("pg")["pg_size"].max()
    whole = sizes[sizes >= world_size].index
    world = pd.DataFrame({"pg": np.repeat(whole.to_numpy(), world_size),
                          "rank": np.tile(np.arange(world_size), len(whole))})
    members = pd.concat([seen[~seen["pg"].isin(whole)], world], ignore_index=True)
    return members.astype({"rank": "int64"}).reset_index(drop=True)


def match_ops(ops: pd.DataFrame, world_size: int, coverage: pd.DataFrame | None = None,
              trace_ranks: frozenset = frozenset()) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(ops with `position` and `instance`, mismatches).

    `instance` numbers each matched instance (-1: unmatched or part of a mismatch). `coverage`
    holds the (rank, step) pairs each rank's source covers; a member is missing from a position
    only in a step it covers (default: the steps in which it issued any op). `trace_ranks` are
    the ranks whose ops come from a Kineto trace alone: where only they disagree, the problem
    says the traces disagree, since a trace may have dropped events.
    """
    ops = ops.sort_values(["rank", "issue_ns"], kind="stable").reset_index(drop=True)
    if coverage is None:
        coverage = ops[["rank", "step"]]
    coverage = coverage[["rank", "step"]].drop_duplicates()
    is_p2p = ops["op"].isin(P2P_OPS).to_numpy()
    collectives, p2p = ops[~is_p2p].copy(), ops[is_p2p].copy()
    collectives["position"] = collectives.groupby(["rank", "pg", "step"]).cumcount()
    collectives, mismatches = _match_collectives(collectives, world_size, coverage, trace_ranks)
    p2p, p2p_mismatches = _match_p2p(p2p)
    first_p2p = int(collectives["instance"].max()) + 1 if len(collectives) else 0
    p2p["instance"] = np.where(p2p["instance"] >= 0, p2p["instance"] + first_p2p, -1)
    matched = pd.concat([collectives, p2p], ignore_index=True)
    matched["instance"] = matched["instance"].astype("int64")
    found = pd.concat([mismatches, p2p_mismatches], ignore_index=True)
    return matched, found.reindex(columns=MISMATCH_COLUMNS)


def _signature(frame: pd.DataFrame) -> pd.Series:
    nbytes = frame["bytes"].map(lambda b: "? B" if b != b else f"{int(b)} B")
    return frame["op"] + " " + nbytes + " " + frame["dtype"].fillna("?")


def _ranks_by_signature(frame: pd.DataFrame) -> pd.Series:
    """Per key: 'all_reduce 4096 B float32 on ranks 0-2; all_gather ... on rank 3'."""
    labelled = frame.assign(signature=_signature(frame))
    per = labelled.groupby(KEY + ["signature"])["rank"].agg(lambda r: format_ranges(sorted(r)))
    text = per.reset_index().assign(
        part=lambda f: f["signature"] + " on rank" + np.where(
            f["rank"].str.contains("[-,]"), "s ", " ") + f["rank"])
    return text.groupby(KEY)["part"].agg("; ".join)


def _missing_ranks(frame: pd.DataFrame, members: pd.DataFrame, coverage: pd.DataFrame
                   ) -> pd.Series:
    """Per key with a member that covers its step but did not issue it: those ranks ('0-2, 5')."""
    keys = frame[KEY].drop_duplicates()
    expected = keys.merge(members, on="pg").merge(coverage, on=["rank", "step"])
    present = expected.merge(frame[KEY + ["rank"]], on=KEY + ["rank"], how="left",
                             indicator=True)
    missing = present[present["_merge"] == "left_only"]
    return missing.groupby(KEY)["rank"].agg(lambda r: format_ranges(sorted(r)))


def _none_missing(frame: pd.DataFrame, codes: np.ndarray, members: pd.DataFrame,
                  coverage: pd.DataFrame) -> bool:
    """Whether every key (numbered by `codes`) was issued by all the members of its group that
    cover its step, counted on arrays: the merges of _missing_ranks cost more than the matching
    itself on a large run. False where it cannot tell cheaply (then _missing_ranks tells)."""
    ranks = np.concatenate([frame["rank"].to_numpy(), members["rank"].to_numpy(),
                            coverage["rank"].to_numpy()])
    if not len(frame) or not np.issubdtype(ranks.dtype, np.integer) or ranks.min() < 0:
        return False
    pg, pgs = pd.factorize(np.concatenate([frame["pg"].to_numpy(object),
                                           members["pg"].to_numpy(object)]))
    step, steps = pd.factorize(np.concatenate([frame["step"].to_numpy(),
                                               coverage["step"].to_numpy()]))
    n_rank = int(ranks.max()) + 1
    if (pg.min() < 0 or step.min() < 0
            or len(pgs) * n_rank * len(steps) > _MAX_MEMBERSHIP_CELLS):
        return False
    rows = len(frame)
    member_rank, covered_rank = np.split(ranks[rows:], [len(members)])
    is_member = np.zeros((len(pgs), n_rank), dtype=np.int64)
    is_member[pg[rows:], member_rank] = 1
    covers = np.zeros((n_rank, len(steps)), dtype=np.int64)
    covers[covered_rank, step[rows:]] = 1
    expected = is_member @ covers  # per (group, step): its members that cover the step
    row_pg, row_step, row_rank = pg[:rows], step[:rows], ranks[:rows]
    # (key, rank) is unique: position counts a rank's ops on the group within the step.
    issued = np.bincount(codes, weights=is_member[row_pg, row_rank]
                         * covers[row_rank, row_step])
    key_pg = np.zeros(len(issued), dtype=np.int64)
    key_step = np.zeros(len(issued), dtype=np.int64)
    key_pg[codes], key_step[codes] = row_pg, row_step
    return bool(np.array_equal(issued, expected[key_pg, key_step]))


def _match_collectives(frame: pd.DataFrame, world_size: int, coverage: pd.DataFrame,
                       trace_ranks: frozenset = frozenset()):
    members = group_members(frame, world_size)
    sized = frame.assign(sized_bytes=frame["bytes"].where(~frame["op"].isin(SIZES_MAY_DIFFER)))
    # One row per key, in the order of ngroup's codes (both sorted by KEY).
    grouped = sized.groupby(KEY, sort=True)
    agg = grouped.agg(ops=("op", "nunique"), sizes=("sized_bytes", "nunique"),
                      dtypes=("dtype", "nunique"), members=("rank", "size"))
    codes = grouped.ngroup().to_numpy()
    differ = (agg["ops"] > 1) | (agg["sizes"] > 1) | (agg["dtypes"] > 1)
    bad_key = differ.to_numpy()
    missing_ranks = None
    if not _none_missing(frame, codes, members, coverage):
        missing_ranks = _missing_ranks(frame, members, coverage)
        if len(missing_ranks):
            bad_key = bad_key | agg.index.isin(missing_ranks.index)
    good = ~bad_key[codes] & (agg["members"].to_numpy()[codes] > 1)
    frame = frame.assign(instance=np.where(good, codes, -1))
    if not bad_key.any():
        return frame, pd.DataFrame(columns=MISMATCH_COLUMNS)
    if missing_ranks is None:
        missing_ranks = _missing_ranks(frame, members, coverage)
    bad = agg.index[differ].union(missing_ranks.index)
    table = pd.DataFrame(index=bad)
    table["ranks"] = _ranks_by_signature(frame[frame.set_index(KEY).index.isin(bad)])
    table["missing_ranks"] = missing_ranks.reindex(bad).astype(object).fillna("")
    different = differ.reindex(bad).fillna(False).to_numpy()
    some_missing = (table["missing_ranks"] != "").to_numpy()
    traced = frame["rank"].isin(list(trace_ranks)).groupby([frame[k] for k in KEY]).all()
    from_traces = traced.reindex(bad).fillna(False).astype(bool).to_numpy()
    table["problem"] = np.select(
        [different & some_missing & ~from_traces, different & ~from_traces, ~from_traces,
         different & some_missing, different],
        ["members disagree and some never issued it", "members disagree on op, size or dtype",
         "some members never issued it",
         "the traces disagree and some lack it (dropped events, or a real mismatch)",
         "the traces disagree on op, size or dtype (dropped events, or a real mismatch)"],
        "missing from some traces (dropped events, or never issued)")
    return frame, table.reset_index()


def _match_p2p(frame: pd.DataFrame):
    if frame.empty:  # most runs have no p2p op: none of the work below
        return (frame.assign(instance=pd.Series(dtype="int64"), position=pd.Series(dtype="int64")),
                pd.DataFrame(columns=MISMATCH_COLUMNS))
    frame = frame.copy()
    frame["instance"] = -1
    known = frame["peer"].notna()
    sends = frame["op"] == "send"
    frame["src"] = np.where(sends, frame["rank"], frame["peer"])
    frame["dst"] = np.where(sends, frame["peer"], frame["rank"])
    frame["position"] = frame.groupby(["pg", "src", "dst", "step", "op"]).cumcount()
    pair_key = ["pg", "src", "dst", "step", "position"]
    usable = frame[known]
    counts = usable.groupby(pair_key)["op"].agg(["nunique", "size"])
    paired = counts[(counts["nunique"] == 2) & (counts["size"] == 2)].index
    frame = frame.merge(pd.DataFrame(index=paired).assign(paired=True), left_on=pair_key,
                        right_index=True, how="left")
    ok = frame["paired"].notna() & known
    codes = frame.groupby(pair_key, sort=True).ngroup().to_numpy()
    frame["instance"] = np.where(ok, codes, -1)
    sizes = frame[ok].groupby(pair_key)["bytes"].transform("nunique")
    differ = sizes.index[sizes.to_numpy() > 1]
    frame.loc[differ, "instance"] = -1
    lone = frame[known & ~ok]
    unequal = frame.loc[differ]
    problems = pd.concat([_lone_p2p(lone), _unequal_p2p(unequal, pair_key)], ignore_index=True)
    return frame.drop(columns=["src", "dst", "paired"]), problems


def _p2p_text(frame: pd.DataFrame) -> pd.Series:
    return (frame["op"] + " " + frame["bytes"].map(lambda b: "? B" if b != b else f"{b:.0f} B")
            + " rank " + frame["src"].astype(int).astype(str) + " -> rank "
            + frame["dst"].astype(int).astype(str))


def _unequal_p2p(pairs: pd.DataFrame, pair_key: list) -> pd.DataFrame:
    """A send and its recv that disagree on the size: one row per pair."""
    if pairs.empty:
        return pd.DataFrame(columns=MISMATCH_COLUMNS)
    labelled = pairs.assign(text=_p2p_text(pairs)).sort_values("op")
    joined = labelled.groupby(pair_key, sort=True)["text"].agg("; ".join).reset_index()
    return pd.DataFrame({"pg": joined["pg"], "step": joined["step"],
                         "position": joined["position"],
                         "problem": "send and recv disagree on size", "ranks": joined["text"],
                         "missing_ranks": ""})


def _lone_p2p(lone: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "pg": lone["pg"], "step": lone["step"], "position": lone["position"],
        "problem": lone["op"].map({"send": "a send with no matching recv",
                                   "recv": "a recv with no matching send"}),
        "ranks": _p2p_text(lone),
        "missing_ranks": np.where(lone["op"] == "send", lone["dst"], lone["src"]).astype(int)
                           .astype(str),
    })
