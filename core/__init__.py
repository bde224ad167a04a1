"""engram's domain core (no FastAPI, no Celery)."""

# The one place the version lives: the package metadata (pyproject), `engram --version` and the API's
# OpenAPI document all read it from here.
__version__ = "0.1.0"
