"""Matching each collective and p2p op across the members of its process group.

Collectives are matched by their position in the group's order within a step (every member
issues a group's collectives in the same order); p2p by (group, src, dst, step, order).
A position where members disagree on op, size or dtype, or where a member never issued it, is a
mismatch (docs/cross-rank.md). Positions, instances and mismatches are found on arrays of codes;
pandas writes the texts of the few mismatches.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core.comm_names import P2P_OPS
from analysis.core.step_spec import format_ranges
from analysis.crossrank.grouped import group_starts

MISMATCH_COLUMNS = ["pg", "step", "position", "problem", "ranks", "missing_ranks"]
KEY = ["pg", "step", "position"]
# Each member of an all_to_all sends its own split sizes: its bytes may differ between members.
SIZES_MAY_DIFFER = ("all_to_all",)


def group_members(ops: pd.DataFrame, world_size: int) -> pd.DataFrame:
    """(pg, rank) of every member: the whole world for a group as large as it, else the ranks
    that issued anything on the group (a group is created on all ranks, used by its members).
    The issuing members come first, in the order of their first op, then the whole-world
    groups' members in the groups' order."""
    collectives = ops[~ops["op"].isin(P2P_OPS)]
    pg, pgs = _codes(collectives["pg"])
    member_pg, member_rank = _members(pg, collectives["rank"].to_numpy(),
                                      collectives["pg_size"].to_numpy(), len(pgs), world_size)
    # Object text, as the ops hold it: pandas would read an object array of text as its
    # string dtype.
    return pd.DataFrame({"pg": pd.Series(pgs[member_pg], dtype=object),
                         "rank": member_rank.astype("int64")})


def _codes(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(each row's code, the distinct values sorted as groupby sorts them) of a column of text
    (object or categorical); a missing value is one more value, sorted last."""
    codes, values = pd.factorize(column.to_numpy(object), sort=True, use_na_sentinel=False)
    return codes, np.asarray(values, dtype=object)


def _members(pg: np.ndarray, rank: np.ndarray, size: np.ndarray, groups: int,
             world_size: int) -> tuple[np.ndarray, np.ndarray]:
    """group_members as (group code, rank) arrays, from each collective's group code, rank and
    group size."""
    largest = np.full(groups, np.iinfo(np.int64).min)
    np.maximum.at(largest, pg, size)
    is_whole = largest >= world_size
    # The first row of each (group, rank), in row order: lexsort is stable.
    order = np.lexsort((rank, pg))
    first = np.sort(order[group_starts(pg[order], rank[order])])
    first = first[~is_whole[pg[first]]]
    whole = np.flatnonzero(is_whole)
    return (np.concatenate([pg[first], np.repeat(whole, world_size)]),
            np.concatenate([rank[first], np.tile(np.arange(world_size), len(whole))]))


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
    collectives = ops[~is_p2p]
    collectives = collectives.assign(position=_positions(collectives))
    collectives, mismatches = _match_collectives(collectives, world_size, coverage, trace_ranks)
    p2p, p2p_mismatches = _match_p2p(ops[is_p2p])
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


def _positions(frame: pd.DataFrame) -> np.ndarray:
    """Each op's position among its rank's ops on its group within the step, in row order
    (groupby(["rank", "pg", "step"]).cumcount())."""
    rank, step, pg = frame["rank"].to_numpy(), frame["step"].to_numpy(), _codes(frame["pg"])[0]
    order = np.lexsort((step, pg, rank))  # stable: row order within a group
    starts = group_starts(rank[order], pg[order], step[order])
    first_row = np.maximum.accumulate(np.where(starts, np.arange(len(order)), 0))
    positions = np.empty(len(order), dtype=np.int64)
    positions[order] = np.arange(len(order)) - first_row
    return positions


def _distinct_per_group(codes: np.ndarray, groups: int, column: pd.Series) -> np.ndarray:
    """groupby(codes)[column].nunique() on arrays: distinct values but NaN/None per group."""
    values, distinct = pd.factorize(column.to_numpy())
    known = values >= 0
    pairs = np.unique(codes[known] * max(len(distinct), 1) + values[known])
    return np.bincount(pairs // max(len(distinct), 1), minlength=groups)


def _dense(*columns) -> tuple[int, list[np.ndarray]]:
    """(the number of distinct values, each value's code among them) of the columns' values
    together."""
    codes, distinct = pd.factorize(np.concatenate(columns))
    return len(distinct), np.split(codes, np.cumsum([len(c) for c in columns])[:-1])


def _some_missing(frame: pd.DataFrame, pg: np.ndarray, codes: np.ndarray, groups: int,
                  members: tuple[np.ndarray, np.ndarray], coverage: pd.DataFrame) -> np.ndarray:
    """Per key (numbered by `codes`): whether a member of its group that covers its step did
    not issue it. Counted on arrays, never per (group, rank, step) cell: a run of a thousand
    ranks has millions of them."""
    member_pg, member_rank = members
    n_rank, (row_rank, member_rank, covered_rank) = _dense(
        frame["rank"].to_numpy(), member_rank, coverage["rank"].to_numpy())
    n_step, (row_step, covered_step) = _dense(frame["step"].to_numpy(),
                                              coverage["step"].to_numpy())
    # Per member and each step its rank covers: (group, step) pairs, one per member expected.
    by_rank = np.argsort(covered_rank, kind="stable")
    covers = np.bincount(covered_rank, minlength=n_rank)
    first_cover = np.cumsum(covers) - covers
    repeats = covers[member_rank]
    offsets = np.arange(repeats.sum()) - np.repeat(np.cumsum(repeats) - repeats, repeats)
    expected_step = covered_step[by_rank][np.repeat(first_cover[member_rank], repeats) + offsets]
    expected = np.sort(np.repeat(member_pg, repeats) * n_step + expected_step)
    # Per key: its rows whose rank is a member of the group and covers the step; a rank issues
    # a key once (its position counts its own ops), so these are distinct members.
    is_member = np.isin(pg * n_rank + row_rank, member_pg * n_rank + member_rank)
    is_covered = np.isin(row_rank * n_step + row_step, covered_rank * n_step + covered_step)
    issued = np.bincount(codes, weights=is_member & is_covered, minlength=groups)
    key_cell = np.zeros(groups, dtype=np.int64)
    key_cell[codes] = pg * n_step + row_step
    wanted = (np.searchsorted(expected, key_cell, side="right")
              - np.searchsorted(expected, key_cell, side="left"))
    return issued < wanted


def _match_collectives(frame: pd.DataFrame, world_size: int, coverage: pd.DataFrame,
                       trace_ranks: frozenset = frozenset()):
    pg, pgs = _codes(frame["pg"])
    step, position = frame["step"].to_numpy(), frame["position"].to_numpy()
    # One code per key, numbered in the keys' sorted order, as groupby(KEY).ngroup() numbers.
    order = np.lexsort((position, step, pg))
    codes = np.empty(len(order), dtype=np.int64)
    codes[order] = np.cumsum(group_starts(pg[order], step[order], position[order])) - 1
    groups = int(codes.max(initial=-1)) + 1
    sized = frame["bytes"].where(~frame["op"].isin(SIZES_MAY_DIFFER))
    differ = np.zeros(groups, dtype=bool)
    for column in (frame["op"], sized, frame["dtype"]):
        differ |= _distinct_per_group(codes, groups, column) > 1
    members = _members(pg, frame["rank"].to_numpy(), frame["pg_size"].to_numpy(), len(pgs),
                       world_size)
    some_missing = _some_missing(frame, pg, codes, groups, members, coverage)
    bad_key = differ | some_missing
    good = ~bad_key[codes] & (np.bincount(codes, minlength=groups)[codes] > 1)
    frame = frame.assign(instance=np.where(good, codes, -1))
    if not bad_key.any():
        return frame, pd.DataFrame(columns=MISMATCH_COLUMNS)
    bad = np.flatnonzero(bad_key)
    row_of_key = np.empty(groups, dtype=np.int64)
    row_of_key[codes] = np.arange(len(codes))
    at = row_of_key[bad]
    table = pd.DataFrame(index=pd.MultiIndex.from_arrays(
        [pd.Index(pgs[pg[at]], dtype=object), step[at], position[at]], names=KEY))
    table["ranks"] = _ranks_by_signature(frame[bad_key[codes]])
    member_frame = pd.DataFrame({"pg": pd.Series(pgs[members[0]], dtype=object),
                                 "rank": members[1]})
    missing_ranks = _missing_ranks(frame[some_missing[codes]], member_frame, coverage)
    table["missing_ranks"] = missing_ranks.reindex(table.index).astype(object).fillna("")
    different = differ[bad]
    missing = some_missing[bad]
    untraced = ~frame["rank"].isin(list(trace_ranks)).to_numpy()
    from_traces = np.bincount(codes, weights=untraced, minlength=groups)[bad] == 0
    table["problem"] = np.select(
        [different & missing & ~from_traces, different & ~from_traces, ~from_traces,
         different & missing, different],
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
