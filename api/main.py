"""ASGI entry point: `uvicorn api.main:app` (each uvicorn worker process imports this)."""

from api.app import create_app
from core.logging import configure_logging
from core.tracing import configure_tracing

configure_logging(process="api")
configure_tracing(service="api")
app = create_app()
