"""Damaged and hostile copies of real run folders, one kind of damage each: the cases of
tests/integration/test_hostile_run_folders.py, and the table of docs/reliability.md.

Each case damages a copy of tests/data/ddp_cpu (a real 2-rank DDP run; rank 1's files unless it
says otherwise) or of the small pipeline run of helpers.pipeline_run, and says what the analysis
must give: the words of the one warning line that names the problem (file, rank, field, value),
and whether rank 1 is still analysed from its trace.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from helpers.launch import DATA
from helpers.pipeline_run import pipeline_run

MB = 1 << 20
DDP_RUN = DATA / "ddp_cpu"
# Root reads a file whatever its permission bits say.
ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


@dataclass(frozen=True)
class Hostile:
    kind: str  # what was done to the folder
    damage: Callable[[Path], None]
    # Words that one `ranktrace: warning:` line holds all of; () where no problem is due.
    named: tuple[str, ...] = ()
    # Whether rank 1 is analysed from a trace still (None: either is right).
    rank1_trace: bool | None = None
    check: Callable[[dict], None] | None = None  # more about the JSON document
    source: str = "ddp"  # "ddp" or "pipeline"


def copy_source(source: str, folder: Path) -> Path:
    if source == "pipeline":
        return pipeline_run(folder)
    shutil.copytree(DDP_RUN, folder)
    return folder


# ---- trace files --------------------------------------------------------------------------------
def trace_of(run: Path, rank: int = 1) -> Path:
    return next(run.glob(f"rank{rank}.*.pt.trace.json.gz"))


def read_doc(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def write_doc(path: Path, doc: dict) -> None:
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))


def _doc(change):
    def damage(run):
        path = trace_of(run)
        doc = read_doc(path)
        change(doc)
        write_doc(path, doc)
    return damage


def _json_text(change):
    """A change of the trace's JSON text (bytes in, bytes out)."""
    def damage(run):
        path = trace_of(run)
        path.write_bytes(gzip.compress(change(gzip.decompress(path.read_bytes()))))
    return damage


def _first_event(field, value):
    def change(doc):
        event = next(e for e in doc["traceEvents"]
                     if e.get("ph") == "X" and e.get("cat") != "user_annotation")
        event[field] = value
    return _doc(change)


def _every_event(change_one):
    def change(doc):
        for event in doc["traceEvents"]:
            if event.get("ph") == "X":
                change_one(event)
    return _doc(change)


def _info(key, value):
    return _doc(lambda d: d["distributedInfo"].__setitem__(key, value))


def _group(key, value):
    return _doc(lambda d: d["distributedInfo"]["pg_config"][0].__setitem__(key, value))


def _profiler_steps_renamed(doc):
    for event in doc["traceEvents"]:
        if str(event.get("name", "")).startswith("ProfilerStep#"):
            event["name"] = "ProfilerStep#" + "9" * 30


def _comm_event_group_size(doc):
    step = next(e for e in doc["traceEvents"] if str(e.get("name")).startswith("ProfilerStep#"))
    doc["traceEvents"].append({
        "ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": step["pid"],
        "tid": step["tid"], "ts": step["ts"] + 1, "dur": 1,
        "args": {"Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024,
                 "dtype": "Float", "Group size": 10 ** 30, "Process Group Name": "0"}})


def _many_events(doc):
    first = next(e for e in doc["traceEvents"] if e.get("ph") == "X")
    doc["traceEvents"].extend(dict(first, ts=first["ts"] + i) for i in range(100_000))


def _truncate(run):
    path = trace_of(run)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _corrupt_middle(run):
    path = trace_of(run)
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 64):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def _not_gzip(run):
    path = trace_of(run)
    path.write_bytes(gzip.decompress(path.read_bytes()))


def _bomb(run):
    """40 x 4 MB of one name: 160 MB of JSON in a few hundred kB of gzip."""
    with gzip.open(trace_of(run), "wb", compresslevel=1) as handle:
        handle.write(b'{"traceEvents":[{"ph":"X","name":"')
        for _ in range(40):
            handle.write(b"a" * (4 * MB))
        handle.write(b'","ts":1,"dur":1}]}')


def _deeply_nested(text):
    return text.replace(b'"args": {', b'"args": {"deep": ' + b"[" * 100_000 + b"]" * 100_000
                        + b", ", 1)


def _duplicate_rank(run):
    """Rank 1's trace replaced by a copy of rank 0's (whose distributedInfo says rank 0)."""
    own = trace_of(run)
    shutil.copyfile(trace_of(run, 0), run / "rank1.9999.pt.trace.json.gz")
    own.unlink()


def _overlapping_windows(run):
    """Rank 1's window copied as a second window of the same process; no comms records, so
    that its collectives come from the traces."""
    path = trace_of(run)
    span = int(path.name.split(".")[1])
    shutil.copyfile(path, run / f"rank1.{span + 1}.pt.trace.json.gz")
    for rank in (0, 1):
        records(run, "comms", rank).unlink()


def _all_reduce_counted_once(doc):
    # Each rank's window (steps 2-3) holds 4 gloo all_reduce: 8 in all, not 12.
    counts = {c["op"]: c["count"] for c in doc["collectives"]}
    assert counts == {"all_reduce": 8}, counts


def _unrenamed(suffix, cut=False):
    """What a rank SIGKILLed while the tracer wrote its trace leaves (tracer/probes/profiler.py):
    Kineto's export not yet gzipped (.raw.tmp), the gzipped copy not yet renamed (.tmp), or
    Kineto's export half written (.raw.tmp.tmp)."""
    def damage(run):
        path = trace_of(run)
        data = path.read_bytes()
        if suffix != ".tmp":
            data = gzip.decompress(data)
        if cut:
            data = data[: len(data) // 2]
        path.with_name(path.name + suffix).write_bytes(data)
        path.unlink()
    return damage


def _symlink_cache(run):
    elsewhere = run.parent / (run.name + "-elsewhere")
    elsewhere.mkdir()
    (run / ".ranktrace-cache").symlink_to(elsewhere, target_is_directory=True)


def _hostile_cache(run):
    """A cache entry with the trace's key that would take 128 MB once read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from analysis.ingest.cache import CACHE_FORMAT
    from tracer import schema

    folder = run / ".ranktrace-cache"
    folder.mkdir()
    trace = trace_of(run)
    stat = trace.stat()
    meta = {"key": f"{stat.st_size}:{stat.st_mtime_ns}:{schema.SCHEMA_VERSION}:{CACHE_FORMAT}"}
    table = pa.table({"ts_ns": pa.array([7] * (16 * MB), type=pa.int64())})
    table = table.replace_schema_metadata({b"ranktrace": json.dumps(meta).encode()})
    pq.write_table(table, folder / (trace.name + ".parquet"), compression="zstd")


def _garbage_cache(run):
    folder = run / ".ranktrace-cache"
    folder.mkdir()
    (folder / (trace_of(run).name + ".parquet")).write_bytes(os.urandom(4096) + b"PAR1")


def _escape_name(run):
    trace_of(run).rename(run / "rank1.\x1b]0;pwned\x07.pt.trace.json.gz")


def _named_like_a_trace(make):
    return lambda run: make(run / "rank2.1.pt.trace.json.gz")


def _symlink_loop(path):
    path.symlink_to(path)


def _unreadable(run):
    os.chmod(trace_of(run), 0)


# ---- the tracer's records -----------------------------------------------------------------------
def records(run: Path, kind: str, rank: int = 1) -> Path:
    return run / f"rank{rank}.{kind}.jsonl"


def _lines(kind, change, rank=1):
    def damage(run):
        path = records(run, kind, rank)
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        changed = change(lines)
        lines = lines if changed is None else changed
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return damage


def _set_all(kind, field, value, only=None, rank=1):
    def change(lines):
        for line in lines:
            if only is None or line.get("kind") == only:
                line[field] = value(line) if callable(value) else value
    return _lines(kind, change, rank)


def _escape_message(lines):
    lines.insert(1, {"kind": "error", "rank": 1, "t_ns": lines[0]["start_ns"],
                     "part": "sampler", "message": "\x1b]0;retitled\x07\x1b[2J cleared"})


def _nested_config(lines):
    lines[0]["config"] = {"deep": [[[]]]}  # made deep in the text below


def _deep_manifest(run):
    _lines("manifest", _nested_config)(run)
    path = records(run, "manifest")
    path.write_text(path.read_text().replace("[[[]]]", "[" * 100_000 + "]" * 100_000, 1))


def _cut_mid_line(kind):
    def damage(run):
        path = records(run, kind)
        text = path.read_text()
        path.write_text(text[: len(text) - 40])
    return damage


def _crashed(lines_kept):
    """Rank 1 died (SIGKILL): its manifest has no run_end, and its step and comm records stop
    after step `lines_kept` (their last lines unwritten); its trace was written before."""
    def damage(run):
        _lines("manifest", lambda lines: [r for r in lines if r["kind"] != "run_end"])(run)
        for kind in ("steps", "comms"):
            _lines(kind, lambda lines: [r for r in lines if r["step"] <= lines_kept])(run)
    return damage


def _steps_profiled(rank, steps):
    def check(doc):
        profiled = {r["rank"]: r["steps_profiled"] for r in doc["ranks"]}
        assert profiled[rank] == steps, profiled
    return check


def _pipeline_stands(doc):
    assert doc["cross_rank"] is not None and "cross_rank" not in doc["unavailable"]
    _steps_profiled(1, [2, 3])(doc)


def _pipeline_rows(doc):
    assert [row["rank"] for row in doc["cross_rank"]["pipeline"]] == [0, 1]


def _records_of_rank(rank):
    return lambda run: shutil.copyfile(records(run, "steps"), run / f"rank{rank}.steps.jsonl")


def _world_of_a_million(run):
    """Every file agrees on a world of 10^6 ranks (in range), of which 2 are here."""
    for rank in (0, 1):
        path = trace_of(run, rank)
        doc = read_doc(path)
        doc["distributedInfo"]["world_size"] = 10 ** 6
        doc["distributedInfo"]["pg_config"][0]["pg_size"] = 10 ** 6
        write_doc(path, doc)
        _set_all("manifest", "world_size", 10 ** 6, rank=rank)(run)
        _set_all("comms", "pg_size", 10 ** 6, rank=rank)(run)


def _large_records(run):
    path = records(run, "samples")
    line = path.read_text().splitlines()[0] + "\n"
    path.write_text(line * (20 * MB // len(line)))


def _no_run_end(run):
    """Rank 1 died (no run_end): the stop diagnosis reads the issue and stack records."""
    _lines("manifest", lambda lines: [r for r in lines if r["kind"] != "run_end"])(run)


def _issued(field, value):
    """Rank 1 died, and each rank's issue records (rank{R}.issued.jsonl, tracer.schema's
    IssueRecord), made from its comm records, are there; rank 1's have `field` set to `value`."""
    def damage(run):
        _no_run_end(run)
        for rank in (0, 1):
            comms = [json.loads(line) for line in records(run, "comms", rank).read_text()
                     .splitlines() if line.strip()]
            issued = [{"step": c["step"], "op": c["op"], "source": c["source"], "pg": c["pg"],
                       "pg_size": c["pg_size"], "position": position, "dtype": c["dtype"],
                       "bytes": c["bytes"], "issue_ns": c["start_ns"]}
                      for position, c in enumerate(comms)]
            if rank == 1:
                for record in issued:
                    record[field] = value
            records(run, "issued", rank).write_text(
                "".join(json.dumps(record) + "\n" for record in issued))
    return damage


def _stacks(field, value):
    """Rank 1 died, leaving one stack dump (rank1.stacks.jsonl) with `field` set to `value`."""
    def damage(run):
        _no_run_end(run)
        dump = {"rank": 1, "t_ns": 1796044278891005652, "reason": "sigterm", "pending": [],
                "threads": [{"name": "MainThread", "thread_id": 1, "main": True, "frames": [
                    {"file": "workloads/ddp.py", "line": 85, "function": "main"}]}]}
        dump[field] = value
        records(run, "stacks").write_text(json.dumps(dump) + "\n")
    return damage


def _stack_kept(doc):
    """The dump whose rank was out of range still says where rank 1 was."""
    ranks = {r["rank"]: r for r in doc["stop_diagnosis"]["ranks"]}
    assert ranks[1]["frames"] and ranks[1]["frames"][0]["line"] == 85, ranks


BIG = 10 ** 30
TRACE = "rank1.1796044278628198866.pt.trace.json.gz"

CASES = [
    # The trace file as a file.
    Hostile("truncated gzip", _truncate, (TRACE, "rank 1", "truncated or corrupt gzip"), False),
    Hostile("bytes flipped mid-gzip", _corrupt_middle, (TRACE, "rank 1", "corrupt gzip"), False),
    Hostile("plain JSON named .gz", _not_gzip, (TRACE, "rank 1", "not gzip"), False),
    Hostile("empty file", lambda run: trace_of(run).write_bytes(b""),
            (TRACE, "rank 1", "an empty file"), False),
    Hostile("gzip bomb", _bomb, (TRACE, "rank 1", "too large to analyse"), False),
    Hostile("white space padding", _json_text(
        lambda t: t.replace(b"},", b"}" + b" " * (2 * MB) + b",", 25)), (), True),
    Hostile("100k more events", _doc(_many_events), (), True),
    # Its JSON.
    Hostile("invalid JSON", _json_text(lambda t: t[: len(t) // 2] + b"}}]]{{"),
            (TRACE, "rank 1", "invalid JSON"), False),
    Hostile("NaN literals", _json_text(lambda t: t.replace(b'"dur": ', b'"dur": NaN, "x": ', 5)),
            (TRACE, "rank 1", "invalid JSON"), False),
    Hostile("invalid UTF-8",
            _json_text(lambda t: t.replace(b'"name": "', b'"name": "\xff\xfe', 20)),
            (TRACE, "rank 1", "Invalid UTF-8"), False),
    Hostile("100k nested arrays in args", _json_text(_deeply_nested),
            (TRACE, "rank 1", "nested too deeply"), False),
    Hostile("traceEvents an object", _doc(lambda d: d.__setitem__("traceEvents", {"a": 1})),
            (TRACE, "rank 1", "not a Kineto trace"), False),
    Hostile("traceEvents null", _doc(lambda d: d.__setitem__("traceEvents", None)),
            (TRACE, "rank 1", "no 'traceEvents' list"), False),
    # Its events' values.
    Hostile("ts as text", _first_event("ts", "soon"), (TRACE, "rank 1", "non-numeric 'ts'"), True),
    Hostile("ts 1e30", _first_event("ts", 1e30), (TRACE, "rank 1", "'ts' out of range", "1e+30"),
            True),
    Hostile("ts -1e15", _first_event("ts", -1e15),
            (TRACE, "rank 1", "'ts' out of range", "-1e+15"), True),
    Hostile("ts a 400-digit int", _first_event("ts", 10 ** 400),
            (TRACE, "rank 1", "'ts' out of range", "an integer of"), True),
    Hostile("dur 1e30", _first_event("dur", 1e30), (TRACE, "rank 1", "'dur' out of range", "1e+30"),
            True),
    Hostile("dur negative", _first_event("dur", -5), (TRACE, "rank 1", "'dur' out of range", "-5"),
            True),
    # pid and tid are labels (Kineto writes "Spans" as one), never numbers: nothing to name.
    Hostile("pid 1e30", _first_event("pid", BIG), (), True),
    Hostile("no event names", _every_event(lambda e: e.pop("name", None)),
            (TRACE, "rank 1", "no ProfilerStep"), True),
    Hostile("ProfilerStep#1e30", _doc(_profiler_steps_renamed),
            (TRACE, "rank 1", "ProfilerStep names have a step number out of range"), True),
    Hostile("Group size 1e30 in a comm event", _doc(_comm_event_group_size),
            (TRACE, "rank 1", "'Group size' out of range", "1e+30"), True),
    # Its distributedInfo.
    Hostile("world size 1e12 in a trace", _info("world_size", 10 ** 12),
            (TRACE, "rank 1", "world_size 1000000000000 is out of range"), True),
    Hostile("world size 0 in a trace", _info("world_size", 0),
            (TRACE, "rank 1", "world_size 0 is out of range"), True),
    Hostile("world size not above the rank", _info("world_size", 1),
            (TRACE, "rank 1", "world_size 1 is not above its rank 1"), True),
    Hostile("world size 5000 in one trace", _info("world_size", 5000),
            ("disagree on the world size", "5000 by rank 1's trace"), True),
    Hostile("every file says world size 1e6", _world_of_a_million,
            ("ranks 2-999999 of world size 1000000 have no trace here",), True),
    Hostile("rank 1e30 in a trace", _info("rank", BIG),
            (TRACE, "rank 1", "distributedInfo rank 1e+30 is out of range"), True),
    Hostile("rank -3 in a trace", _info("rank", -3),
            (TRACE, "rank 1", "distributedInfo rank -3 is out of range"), True),
    Hostile("pg_size 1e30 in pg_config", _group("pg_size", BIG),
            (TRACE, "rank 1", "pg_size 1e+30 is out of range"), True),
    Hostile("ranks 1e30 in pg_config", _group("ranks", [0, BIG]),
            (TRACE, "rank 1", "its ranks are not all ranks below 2"), True),
    # Trace files among themselves.
    Hostile("rank 0's trace copied as rank 1's", _duplicate_rank,
            ("duplicate rank 0", "rank1.9999.pt.trace.json.gz"), False),
    Hostile("two windows of rank 1 overlap", _overlapping_windows,
            ("rank1.1796044278628198867.pt.trace.json.gz", "rank 1", "overlaps", "steps 2-3",
             "counted once"), True, _all_reduce_counted_once),
    Hostile("killed before gzip: .raw.tmp", _unrenamed(".raw.tmp"),
            (TRACE + ".raw.tmp", "rank 1", "never renamed"), True),
    Hostile("killed before the rename: .tmp", _unrenamed(".tmp"),
            (TRACE + ".tmp", "rank 1", "never renamed"), True),
    Hostile("killed mid-export: .raw.tmp.tmp", _unrenamed(".raw.tmp.tmp", cut=True),
            (TRACE + ".raw.tmp.tmp", "rank 1", "invalid JSON"), False),
    Hostile("a trace named for rank 1e20", lambda run: trace_of(run).rename(
        run / f"rank{10 ** 20}.1.pt.trace.json.gz"),
        (f"rank{10 ** 20}.1", "rank 100000000000000000000 is out of range"), True),
    # The folder.
    Hostile("cache folder a symlink", _symlink_cache, (), True),
    Hostile("cache entry of 128 MB", _hostile_cache, (), True),
    Hostile("cache entry of garbage", _garbage_cache, (), True),
    Hostile("escape codes in a file name", _escape_name, (), True),
    Hostile("a folder named like a trace", _named_like_a_trace(Path.mkdir), (), True),
    Hostile("a symlink loop named like a trace", _named_like_a_trace(_symlink_loop),
            ("rank2.1.pt.trace.json.gz", "rank 2", "cannot read", "symbolic links"), True),
    Hostile("a dangling symlink named like a trace",
            _named_like_a_trace(lambda p: p.symlink_to(p.with_name("gone"))),
            ("rank2.1.pt.trace.json.gz", "rank 2", "cannot read"), True),
    Hostile("a FIFO named like a trace", _named_like_a_trace(os.mkfifo),
            ("rank2.1.pt.trace.json.gz", "rank 2", "not a regular file (a FIFO)"), True),
    Hostile("/dev/zero named like a trace",
            _named_like_a_trace(lambda p: p.symlink_to("/dev/zero")),
            ("rank2.1.pt.trace.json.gz", "rank 2", "not a regular file (a device)"), True),
    Hostile("a trace without read permission", _unreadable,
            () if ROOT else (TRACE, "rank 1", "cannot read", "Permission denied"), ROOT),
    # The manifest.
    Hostile("escape codes in a manifest message", _lines("manifest", _escape_message),
            ("rank1.manifest.jsonl", "rank 1", "tracer part 'sampler' failed"), True),
    Hostile("manifest world size 1e12", _set_all("manifest", "world_size", 10 ** 12),
            ("rank1.manifest.jsonl", "rank 1", "world_size 1000000000000 is out of range"), True),
    Hostile("manifest rank 1e30", _set_all("manifest", "rank", BIG),
            ("rank1.manifest.jsonl", "rank 1", "rank 1e+30 is out of range"), True),
    Hostile("clock_sync offset 1e30", _set_all("manifest", "offset_ns", BIG, only="clock_sync"),
            ("rank1.manifest.jsonl", "rank 1", "clock_sync offset_ns 1e+30", "set aside"), True),
    Hostile("manifest missing", lambda run: records(run, "manifest").unlink(), (), True),
    Hostile("manifest not JSON", lambda run: records(run, "manifest").write_text("not json\n{{\n"),
            ("rank1.manifest.jsonl", "rank 1", "line 1 skipped"), True),
    Hostile("100k nested arrays in the manifest", _deep_manifest,
            ("rank1.manifest.jsonl", "rank 1", "line 1 skipped", "nested too deeply"), True),
    # Step records.
    Hostile("step records cut mid-line", _cut_mid_line("steps"),
            ("rank1.steps.jsonl", "rank 1", "cut short"), True),
    Hostile("step records stop early", _lines("steps", lambda lines: lines[:1]),
            ("rank1.steps.jsonl", "rank 1", "1 step records", "run_end counts 5"), True,
            _steps_profiled(1, [2, 3])),
    Hostile("a crashed rank's records stop early", _crashed(0),
            (TRACE, "rank 1", "ProfilerStep 2-3", "the trace is complete"), True,
            _steps_profiled(1, [2, 3])),
    Hostile("step number 1e30", _set_all("steps", "step", BIG),
            ("rank1.steps.jsonl", "rank 1", "'step' out of range", "1e+30"), True),
    Hostile("step end_ns 1e30", _set_all("steps", "end_ns", BIG),
            ("rank1.steps.jsonl", "rank 1", "'end_ns' out of range", "1e+30"), True),
    Hostile("steps that end before they start",
            _set_all("steps", "end_ns", lambda line: line["start_ns"] - 1),
            ("rank1.steps.jsonl", "rank 1", "end before they start"), True),
    Hostile("record files of rank 1e20", _records_of_rank(10 ** 20),
            ("rank 100000000000000000000", "out of range"), True),
    # Samples.
    Hostile("samples garbage", lambda run: records(run, "samples").write_text(
        records(run, "samples").read_text() + "{broken\n\x00\x01\n[1,2]\n"),
        ("rank1.samples.jsonl", "rank 1", "skipped"), True),
    Hostile("samples rss_bytes 1e30", _set_all("samples", "rss_bytes", BIG),
            ("rank1.samples.jsonl", "rank 1", "'rss_bytes' out of range", "value is set aside"),
            True),
    Hostile("a samples file of 20 MB", _large_records,
            ("rank1.samples.jsonl", "rank 1", "too large to read"), True),
    # Comm records.
    Hostile("comms peer 1e30", _set_all("comms", "peer", BIG),
            ("rank1.comms.jsonl", "rank 1", "'peer' out of range", "1e+30"), True),
    Hostile("comms pg_size 1e30", _set_all("comms", "pg_size", BIG),
            ("rank1.comms.jsonl", "rank 1", "'pg_size' out of range", "1e+30"), True),
    Hostile("comms pg_size 0", _set_all("comms", "pg_size", 0),
            ("rank1.comms.jsonl", "rank 1", "'pg_size' out of range", "first 0"), True),
    Hostile("comms bytes negative", _set_all("comms", "bytes", -1),
            ("rank1.comms.jsonl", "rank 1", "'bytes' out of range", "first -1"), True),
    Hostile("comms bytes 1e30", _set_all("comms", "bytes", BIG),
            ("rank1.comms.jsonl", "rank 1", "'bytes' out of range", "1e+30"), True),
    Hostile("comms end_ns 1e30", _set_all("comms", "end_ns", BIG),
            ("rank1.comms.jsonl", "rank 1", "'end_ns' out of range", "1e+30"), True),
    Hostile("escape codes in a comms op", _set_all("comms", "op", "\x1b[2Jteleport"), (), True),
    # Issue and stack records (the stop diagnosis of a rank that died).
    Hostile("issued pg_size 1e30", _issued("pg_size", BIG),
            ("rank1.issued.jsonl", "rank 1", "'pg_size' out of range", "1e+30"), True),
    Hostile("issued peer 1e30", _issued("peer", BIG),
            ("rank1.issued.jsonl", "rank 1", "'peer' out of range", "value is set aside"), True),
    Hostile("issued position -1", _issued("position", -1),
            ("rank1.issued.jsonl", "rank 1", "'position' out of range", "first -1"), True),
    Hostile("stack dump rank 1e30", _stacks("rank", BIG),
            ("rank1.stacks.jsonl", "rank 1", "stack dump rank 1e+30 is out of range"), True,
            _stack_kept),
    Hostile("stack dump t_ns 1e30", _stacks("t_ns", BIG),
            ("rank1.stacks.jsonl", "rank 1", "stack dump t_ns 1e+30", "record is set aside"),
            True),
    # A pipeline run.
    Hostile("a pipeline run, undamaged", lambda run: None, (), True, _pipeline_rows, "pipeline"),
    Hostile("a pipeline rank's records stop early", _crashed(1),
            ("rank1.manifest.jsonl", "rank 1", "no run_end"), True, _pipeline_stands,
            "pipeline"),
]
