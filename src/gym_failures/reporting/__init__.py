"""Reporting: what a run's saved rows say, for people and machines.

- `gym_failures.reporting.summary`: failures counted and grouped over the row files by DuckDB
  (`summarize`, `Summary`); needs the `cli` extra (duckdb).
- `gym_failures.reporting.explain`: the cause tree of one saved row or rollout (`explain_row`,
  `line_row`, `rollout_rows`).
- `gym_failures.reporting.html`: a `Summary` as one self-contained HTML page (`render_html`).

The summary's parts, each private to the package:

- `_roots`: the root cause of a failure: the deepest event of a report's cause chain (`root_event`,
  `saved_root`), or the innermost gym-failures error body in a NeMo Gym row's text, read through
  NeMo Gym's layers of quoting (`body_root`); `row_root` for a row. Needs neither DuckDB nor pydantic:
  the gate calls it too.
- `_reasons`: failure reasons with their variable parts (ports, ids, addresses, numbers) normalized,
  so that two runs of one failure group together (`normalized_reason`, and the same in SQL).
- `_sql`: the summary engine's SQL: the columns read, the macros and every row's group key.
- `_groupings`: the summary's groupings (by class, kind, root cause, boundary, stage, status,
  attempt, reason) and their models.
- `_cost_keys`: what one attempt cost, read strictly from its row's `_gf_duration_s`, `_gf_usage` and
  `_gf_model_calls`, in Python (`row_cost`: telemetry reads it too) and in the summary's SQL.
- `_cost`: what failures cost (`Cost`): attempts, seconds and tokens of failed attempts and re-runs,
  by class, kind and root cause, and the amplification of model attempts per rollout; the cells the
  terminal and the HTML page show.

The HTML page's parts:

- `_html_parts`: its tables and cell formats.
- `_cost_html`: its section "What failures cost".

Every tool reads rows through `gym_failures.rows`. Nothing is imported here, so that importing one tool
never loads duckdb for another.
"""
