"""App factories for the under-uvicorn middleware benchmark (`uvicorn --factory ...:gym`)."""

from __future__ import annotations

from starlette.applications import Starlette

from benchmarks.bench_middleware import BaseHTTPFailureMiddleware, FloorMiddleware, _app
from gym_failures.asgi import FailureReportMiddleware


def bare() -> Starlette:
    return _app()


def floor() -> Starlette:
    app = _app()
    app.add_middleware(FloorMiddleware)
    return app


def gym() -> Starlette:
    app = _app()
    app.add_middleware(FailureReportMiddleware, boundary="agent")
    return app


def base_http() -> Starlette:
    app = _app()
    app.add_middleware(BaseHTTPFailureMiddleware)
    return app
