"""`gym-failures serve model`: run the fault-injecting model endpoint (`gym_failures.model_endpoint`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from gym_failures.model_endpoint import FAULTS

__all__ = ["serve_app"]

_FAULT_HELP = "\n\n".join(f"{name}: {what}" for name, what in FAULTS.items())

serve_app = typer.Typer(
    name="serve",
    help="Run a server from this library for testing clients against real failure shapes.",
    no_args_is_help=True,
)


@serve_app.command(
    "model",
    help=(
        "An OpenAI- and Anthropic-compatible model endpoint with fault injection: POST "
        "/v1/responses, /v1/chat/completions and /v1/messages (plain and streamed), GET /v1/models "
        "and GET /health. Force a fault on one request with the header `X-Gym-Fault: <name>` "
        "(parameters: `; times=N; retry_after=S; delay=S; id=X`). The faults:\n\n" + _FAULT_HELP
    ),
)
def model(
    host: Annotated[str, typer.Option(help="The address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="The port to listen on.")] = 8000,
    fault_plan: Annotated[
        Path | None,
        typer.Option(
            "--fault-plan",
            exists=True,
            dir_okay=False,
            help='A JSON plan of fault rates, e.g. {"rates": {"quota_429": 0.05}, "seed": 7}.',
        ),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="GYM_FAILURES_API_KEY",
            help="Require this key (Bearer or x-api-key) on every /v1 request.",
        ),
    ] = None,
) -> None:
    import uvicorn
    from pydantic import ValidationError

    from gym_failures.model_endpoint import ModelEndpoint, load_plan
    from gym_failures.redaction import MIN_KNOWN_SECRET, register_secret

    try:
        plan = load_plan(fault_plan)
    except (ValidationError, ValueError, OSError) as error:
        typer.echo(f"the fault plan {fault_plan} is not valid: {error}", err=True)
        raise typer.Exit(code=2) from None
    if api_key and len(api_key) >= MIN_KNOWN_SECRET:
        register_secret(api_key)  # a failure text quoting it is scrubbed, whoever made it
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = ModelEndpoint(plan=plan, api_key=api_key or None).app()
    uvicorn.run(app, host=host, port=port, log_config=None, access_log=False)
