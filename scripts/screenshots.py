"""Make the PNGs of docs/viewing.md: the HTML report and the merged timeline of a run.

    python scripts/screenshots.py RUN [--out docs/img]

RUN is a traced run folder (e.g. a 2-rank DDP demo run). The report is written and shot in
headless Chromium. Perfetto UI and chrome://tracing cannot be driven offline, so the merged
timeline file is drawn as a static page (one row per rank and track, flows as lines) and shot.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
from collections import defaultdict
from html import escape
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis.report.html import write_html_report  # noqa: E402
from analysis.report.html.browser import find_chromium, screenshot  # noqa: E402
from analysis.run.analysed_run import open_run  # noqa: E402
from analysis.timeline import gather, window_steps, write_timeline  # noqa: E402

COLOURS = {"step": "#bab0ac", "collective": "#f58518", "cpu_op": "#4c78a8",
           "user_annotation": "#72b7b2", "kernel": "#54a24b", "gpu_memcpy": "#b279a2"}


def timeline_page(document: dict, width: int = 1400) -> str:
    """A static drawing of a merged timeline: every (rank, track) a row, flows as lines."""
    events = document["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    processes = {e["pid"]: e["args"]["name"] for e in events
                 if e["ph"] == "M" and e["name"] == "process_name"}
    slices = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            slices[(e["pid"], e["tid"])].append(e)
    rows = sorted(slices)
    # The drawing spans the analysed steps; longer slices (the profiler's own span) are cut.
    analysed = {f"step {s}" for s in document["otherData"]["steps"]}
    marks = [e for group in slices.values() for e in group if e["name"] in analysed]
    begin = min(e["ts"] for e in marks)
    end = max(e["ts"] + e["dur"] for e in marks) - begin
    left, bar = 300, 14
    scale = (width - left - 10) / end

    def clip(t: float) -> float:
        return min(max(t - begin, 0.0), end)
    row_y = {key: 10 + i * (bar + 4) for i, key in enumerate(rows)}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
           f'height="{20 + len(rows) * (bar + 4)}" font-family="sans-serif" font-size="11">']
    for key in rows:
        y = row_y[key]
        label = f"{processes.get(key[0], key[0])}: {names.get(key, key[1])}"
        out.append(f'<text x="{left - 6}" y="{y + 11}" text-anchor="end">'
                   f'{escape(label[:52])}</text>')
        for e in slices[key]:
            colour = COLOURS.get(e.get("cat"), "#9d755d")
            x0, x1 = clip(e["ts"]), clip(e["ts"] + e["dur"])
            out.append(f'<rect x="{left + x0 * scale:.1f}" y="{y}" '
                       f'width="{max((x1 - x0) * scale, 0.4):.1f}" height="{bar}" '
                       f'fill="{colour}" fill-opacity="0.8"/>')
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    for e in events:
        if e["ph"] == "f" and e["id"] in starts:
            s = starts[e["id"]]
            y1 = row_y.get((s["pid"], s["tid"]), 0) + bar / 2
            y2 = row_y.get((e["pid"], e["tid"]), 0) + bar / 2
            out.append(f'<line x1="{left + clip(s["ts"]) * scale:.1f}" y1="{y1}" '
                       f'x2="{left + clip(e["ts"]) * scale:.1f}" y2="{y2}" stroke="#d62728" '
                       f'stroke-width="1.5"/>')
    out.append("</svg>")
    return ("<!DOCTYPE html><html><body style='margin:8px'><h3 style='font-family:sans-serif'>"
            "Merged timeline: every rank on one clock; red lines: who waited for whom</h3>"
            + "".join(out) + "</body></html>")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a traced run folder")
    parser.add_argument("--out", type=Path, default=Path("docs/img"),
                        help="where the PNGs go (default: %(default)s)")
    args = parser.parse_args()
    if find_chromium() is None:
        parser.error("chromium is not installed (apt-get install chromium)")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        run = open_run(args.run, use_cache=False)
        write_html_report(run.report, work / "report.html")
        screenshot(work / "report.html", args.out / "report.png", size=(1200, 2400))
        gathered = gather(run.loaded)
        write_timeline(gathered, window_steps(gathered["ranks"]), work / "t.trace.gz", 200e6)
        document = json.loads(gzip.decompress((work / "t.trace.gz").read_bytes()))
        (work / "timeline.html").write_text(timeline_page(document))
        screenshot(work / "timeline.html", args.out / "timeline.png", size=(1400, 400))
    print(f"wrote {args.out / 'report.png'} and {args.out / 'timeline.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
