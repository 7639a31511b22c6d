"""Reporting: what a run's saved rows say, for people and machines.

- `gym_failures.reporting.summary`: failures counted and grouped over the row files by DuckDB
  (`summarize`, `Summary`); needs the `cli` extra (duckdb).
- `gym_failures.reporting.explain`: the cause tree of one saved row or rollout (`explain_row`,
  `line_row`, `rollout_rows`).
- `gym_failures.reporting.html`: a `Summary` as one self-contained HTML page (`render_html`).

Every tool reads rows through `gym_failures.rows`. Nothing is imported here, so that importing one tool
never loads duckdb for another.
"""
