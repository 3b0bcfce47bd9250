"""The standalone HTML report of an analysed run (docs/viewing.md): one file, every script and
style inline, no network; `write_html_report(report, path)` writes it."""

from analysis.report.html.page import build_html, html_table, write_html_report  # noqa: F401
