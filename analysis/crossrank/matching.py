"""Matching each collective and p2p op across the members of its process group.

Collectives are matched by their position in the group's order within a step (every member
issues a group's collectives in the same order); p2p by (group, src, dst, step, order).
A position where members disagree on op, size or dtype, or where a member never issued it, is a
mismatch (docs/cross-rank.md). Everything here is vectorised: groupby, merge, cumcount.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core.steps import format_ranges
from analysis.crossrank.frames import P2P_OPS

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
    quick = _members_on_arrays(collectives, world_size)
    if quick is not None:
        return quick
    seen = collectives[["pg", "rank"]].drop_duplicates()
    sizes = collectives.groupby("pg")["pg_size"].max()
    whole = sizes[sizes >= world_size].index
    world = pd.DataFrame({"pg": np.repeat(whole.to_numpy(), world_size),
                          "rank": np.tile(np.arange(world_size), len(whole))})
    members = pd.concat([seen[~seen["pg"].isin(whole)], world], ignore_index=True)
    return members.astype({"rank": "int64"}).reset_index(drop=True)


def _text_codes(column: pd.Series) -> tuple[np.ndarray, np.ndarray] | None:
    """(codes, sorted distinct values) of a column of text alone, as groupby sorts them; None
    for any other column (NaN, numbers), which the pandas calls handle."""
    codes, values = pd.factorize(column.to_numpy(object), sort=True)
    if (codes < 0).any() or pd.api.types.infer_dtype(values, skipna=False) != "string":
        return None
    return codes, np.asarray(values, dtype=object)


def _members_on_arrays(collectives: pd.DataFrame, world_size: int) -> pd.DataFrame | None:
    """group_members' frame, row for row, from arrays: groupby and drop_duplicates cost more
    than the matching on a large run. None where the pandas calls are needed (empty, groups not
    named by text, ranks or sizes not integers)."""
    rank, size = collectives["rank"].to_numpy(), collectives["pg_size"].to_numpy()
    if (not len(collectives) or not np.issubdtype(rank.dtype, np.integer)
            or not np.issubdtype(size.dtype, np.integer) or rank.min() < 0):
        return None
    found = _text_codes(collectives["pg"])
    if found is None:
        return None
    pg, pgs = found
    largest = np.full(len(pgs), np.iinfo(np.int64).min)
    np.maximum.at(largest, pg, size)
    is_whole = largest >= world_size
    # First (group, rank) occurrences, in the order of the rows.
    first = np.sort(np.unique(pg * (int(rank.max()) + 1) + rank, return_index=True)[1])
    first = first[~is_whole[pg[first]]]
    whole = pgs[is_whole]
    # pandas would read text in an object array as its string dtype; group_members' is object.
    return pd.DataFrame({
        "pg": pd.Series(np.concatenate([pgs[pg[first]], np.repeat(whole, world_size)]),
                        dtype=object),
        "rank": np.concatenate([rank[first], np.tile(np.arange(world_size), len(whole))]
                               ).astype("int64")})


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
    if is_p2p.any() or not len(ops):
        collectives, p2p = ops[~is_p2p].copy(), ops[is_p2p].copy()
    else:  # most runs have no p2p op: no split, none of the p2p work and no concatenation
        collectives, p2p = ops, None
    collectives["position"] = _positions(collectives)
    collectives, mismatches = _match_collectives(collectives, world_size, coverage, trace_ranks)
    if p2p is None:
        matched, p2p_mismatches = collectives, pd.DataFrame(columns=MISMATCH_COLUMNS)
    else:
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


def _positions(frame: pd.DataFrame):
    """Each op's position among its rank's ops on its group within the step, in row order
    (groupby(["rank", "pg", "step"]).cumcount()), counted on arrays where the keys allow."""
    rank, step = frame["rank"].to_numpy(), frame["step"].to_numpy()
    found = _text_codes(frame["pg"]) if _integers(rank, step) else None
    if found is None:
        return frame.groupby(["rank", "pg", "step"]).cumcount()
    order = np.lexsort((step, found[0], rank))  # stable: row order within a group
    starts = _group_starts(rank[order], found[0][order], step[order])
    first_row = np.maximum.accumulate(np.where(starts, np.arange(len(order)), 0))
    positions = np.empty(len(order), dtype=np.int64)
    positions[order] = np.arange(len(order)) - first_row
    return positions


def _integers(*arrays) -> bool:
    return bool(len(arrays[0])) and all(np.issubdtype(a.dtype, np.integer) for a in arrays)


def _group_starts(*sorted_keys) -> np.ndarray:
    """Where a new group starts among rows sorted by their keys."""
    starts = np.zeros(len(sorted_keys[0]), dtype=bool)
    starts[:1] = True
    for key in sorted_keys:
        starts[1:] |= key[1:] != key[:-1]
    return starts


def _distinct_per_group(codes: np.ndarray, groups: int, column: pd.Series) -> np.ndarray:
    """groupby(codes)[column].nunique() on arrays: distinct values but NaN/None per group."""
    values, distinct = pd.factorize(column.to_numpy())
    known = values >= 0
    pairs = np.unique(codes[known] * max(len(distinct), 1) + values[known])
    return np.bincount(pairs // max(len(distinct), 1), minlength=groups)


def _matched_on_arrays(frame: pd.DataFrame, world_size: int, coverage: pd.DataFrame
                       ) -> pd.DataFrame | None:
    """_match_collectives' frame where no position is a mismatch, found on arrays: the groupby
    aggregations cost more than the matching on a large run. None where there is a mismatch or
    the keys are not plain (the pandas calls then tell)."""
    step, position = frame["step"].to_numpy(), frame["position"].to_numpy()
    found = _text_codes(frame["pg"]) if _integers(step, position) else None
    if found is None:
        return None
    pg = found[0]
    # One code per key, numbered in the keys' sorted order, as groupby(KEY).ngroup() numbers.
    order = np.lexsort((position, step, pg))
    codes = np.empty(len(order), dtype=np.int64)
    codes[order] = np.cumsum(_group_starts(pg[order], step[order], position[order])) - 1
    groups = int(codes.max()) + 1
    sized = frame["bytes"].where(~frame["op"].isin(SIZES_MAY_DIFFER))
    if any((_distinct_per_group(codes, groups, column) > 1).any()
           for column in (frame["op"], sized, frame["dtype"])):
        return None
    if not _none_missing(frame, codes, group_members(frame, world_size), coverage):
        return None
    good = np.bincount(codes, minlength=groups)[codes] > 1
    return frame.assign(instance=np.where(good, codes, -1))


def _match_collectives(frame: pd.DataFrame, world_size: int, coverage: pd.DataFrame,
                       trace_ranks: frozenset = frozenset()):
    quick = _matched_on_arrays(frame, world_size, coverage)
    if quick is not None:
        return quick, pd.DataFrame(columns=MISMATCH_COLUMNS)
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
