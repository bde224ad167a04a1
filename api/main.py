"""ASGI entry point: `uvicorn api.main:app` (each uvicorn worker process imports this)."""

import gc

from api.app import create_app
from core.logging import configure_logging
from core.tracing import configure_tracing

configure_logging(process="api")
configure_tracing(service="api")
app = create_app()
# The modules every search runs through are loaded now, not by the first request.
import core.search.service  # noqa: E402, F401

# Everything loaded so far lives as long as the process: move it out of the collector's sight. A full
# collection walked these ~170,000 objects every few seconds under load, stopping every request for
# ~50-100 ms each time (measured on the 2-core machine); the workers do the same (workers.tasks).
gc.collect()
gc.freeze()
