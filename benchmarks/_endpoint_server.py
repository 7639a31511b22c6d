"""One server for `bench_model_endpoint`: `python -m benchmarks._endpoint_server ours|llmock STACK PORT`,
STACK `asyncio+h11` or `uvloop+httptools`, access log off, as `serve model` runs ours."""

from __future__ import annotations

import sys

import uvicorn


def main() -> None:
    kind, stack, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    loop, http = ("asyncio", "h11") if stack == "asyncio+h11" else ("uvloop", "httptools")
    if kind == "ours":
        from gym_failures.model_endpoint import ModelEndpoint, ModelEndpointPlan

        app = ModelEndpoint(plan=ModelEndpointPlan()).app()
    else:
        from llmock.main import create_app  # type: ignore[import-not-found,unused-ignore]

        app = create_app()
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        loop=loop,
        http=http,
        access_log=False,
        log_level="warning",
        lifespan="auto",
    )


if __name__ == "__main__":
    main()
