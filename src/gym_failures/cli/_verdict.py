"""`gym-failures verdict`: print the model endpoint's recovery verdict, from a file `serve model
--verdict-file` wrote or from a running endpoint's URL; exit status 1 when a finding fails it.

The verdict is per logical call (a call's outcome is its last attempt; `gym_failures.model_endpoint.
_verdict` says how attempts are grouped and what fails). With `--client`, the client's own rows add
evidence: a call that ended in a broken stream is resolved only by a failure row naming it (the agent
failed with it), a success row built on a fault (its `failure_id`) is a failure, and a fault the rows
hold no trace of is a warning. Seeing a fault never resolves it. `--allow-give-up` makes `gave_up` a
warning, for a client that gives up on purpose; `--max-attempts N` is the attempts a call may make
before giving up is its due (3, the SDKs' 1 + 2 retries). The endpoint's URL is shown without its
secrets; its key goes in the `Authorization` header only.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gym_failures.cli._exits import EXIT_FAILED, EXIT_OK, CommandError, first_problem
from gym_failures.cli._inputs import require_file
from gym_failures.cli._options import Subcommands, add_command, at_least

__all__ = ["VERDICT_EXIT_HELP", "add_verdict"]

VERDICT_EXIT_HELP = """exit status:
  0    the client recovered: no failing finding (warnings may be listed)
  1    a failing finding: retry_after_ignored, retried_non_retryable,
       retry_storm, cut_stream_accepted, failed_stream_accepted,
       malformed_chunk_ignored, failure_accepted or gave_up
  2    nothing judged: a file that is not a verdict file, an endpoint that
       cannot be reached, a --client file that is not rows or a report"""


def add_verdict(commands: Subcommands) -> None:
    parser = add_command(
        commands,
        "verdict",
        _run_verdict,
        help="print a model endpoint's or a proxy's verdict on a client's recovery; exit 1 when it failed",
        description="Print the recovery verdict of `gym-failures serve model` or `gym-failures serve "
        "proxy`, call by call: from a file its --verdict-file wrote, or from a running server's URL. "
        "With --client (a collector's rows, `collect`'s rows.jsonl or its failures file), the client's "
        "rows add evidence: a call that ended in a broken stream is resolved only by a failure row "
        "naming it (seen is not handled), and a success row built on a fault fails.",
        extra=None,
    )
    parser.epilog = VERDICT_EXIT_HELP
    parser.add_argument("source", metavar="FILE|URL", help="a --verdict-file, or http://HOST:PORT")
    parser.add_argument(
        "--client",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="the client's record: rows (JSONL) or a failure report (JSON); repeatable",
    )
    parser.add_argument(
        "--allow-give-up",
        action="store_true",
        help="gave_up is a warning: the client gives up on purpose (no retries)",
    )
    parser.add_argument(
        "--max-attempts",
        type=at_least(1),
        default=None,
        metavar="N",
        help="a call that ends in a retryable failure with fewer attempts gave up (default 3)",
    )
    parser.add_argument("--api-key", default=None, metavar="KEY", help="the endpoint's key, for a URL")
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")


def _run_verdict(arguments: argparse.Namespace) -> int:
    import json

    from pydantic import ValidationError

    from gym_failures.model_endpoint import Attempt, client_record, judge

    source: str = arguments.source
    if source.startswith(("http://", "https://")):
        document = _fetch_journal(source, arguments.api_key)
        raw_attempts = document.get("attempts")
    else:
        path = Path(source)
        require_file(path, source)
        try:
            document = json.loads(path.read_text("utf-8"))
        except (ValueError, UnicodeDecodeError) as error:
            raise CommandError(f"{source}: not a verdict file (not JSON: {error})") from None
        raw_attempts = document.get("journal") if isinstance(document, dict) else None
    if not isinstance(raw_attempts, list):
        raise CommandError(f"{source}: not a verdict file (no journal of attempts)")
    try:
        attempts = [Attempt.model_validate(item) for item in raw_attempts]
    except ValidationError as error:
        raise CommandError(f"{source}: not a verdict file: {first_problem(error)}") from None
    client = None
    if arguments.client:
        client = client_record(*(_client_file(path) for path in arguments.client))
    bounds = {} if arguments.max_attempts is None else {"max_attempts": arguments.max_attempts}
    verdict = judge(attempts, client, allow_give_up=arguments.allow_give_up, **bounds)
    if arguments.json:
        print(verdict.model_dump_json(indent=1))
    else:
        print(verdict.text())
    return EXIT_OK if verdict.passed else EXIT_FAILED


def _fetch_journal(url: str, api_key: str | None) -> dict[str, Any]:
    import json
    import urllib.error
    import urllib.request

    from gym_failures.redaction import url_without_secrets

    shown = url_without_secrets(url)
    request = urllib.request.Request(url.rstrip("/") + "/_gym/journal")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            document = json.loads(reply.read(64 << 20))
    except urllib.error.HTTPError as error:
        raise CommandError(f"{shown}: the endpoint answered {error.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise CommandError(f"{shown}: cannot read the journal ({type(error).__name__})") from None
    if not isinstance(document, dict):
        raise CommandError(f"{shown}: not a model endpoint's journal")
    return document


def _client_file(path: Path) -> list[object]:
    """The records in a --client file: each JSON line (rows, reports, event ids), or one JSON value."""
    import json

    from gym_failures.failure_records import FailureReport

    require_file(path, f"--client {path}")
    text = path.read_text("utf-8", errors="replace")
    try:
        values = [json.loads(text)]
    except ValueError:
        values = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                values.append(json.loads(line))
            except ValueError:
                raise CommandError(f"--client {path}:{number}: not JSON") from None
    records: list[object] = []
    for value in values:
        if isinstance(value, dict) and "events" in value and "_ng_failure_events" not in value:
            try:
                records.append(FailureReport.model_validate(value))
            except ValueError:
                raise CommandError(f"--client {path}: not a failure report") from None
        elif isinstance(value, dict):
            records.append(value)
        elif isinstance(value, list) and all(isinstance(item, (str, dict)) for item in value):
            records.extend(value)
        elif isinstance(value, str):
            records.append(value)
        else:
            raise CommandError(f"--client {path}: not rows, a failure report or event ids")
    return records
