"""ASGI entry point: `uvicorn api.main:app` (each uvicorn worker process imports this)."""

from api.app import create_app
from core.heap import settle_heap
from core.logging import configure_logging
from core.tracing import configure_tracing

configure_logging(process="api")
configure_tracing(service="api")
app = create_app()
# The modules every search runs through are loaded now, not by the first request.
import core.search.service  # noqa: E402, F401

# Everything loaded so far lives as long as the process, and requests' objects die young (core.heap).
settle_heap()
