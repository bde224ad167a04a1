"""Python SDK for engram, the memory service for AI agents.

``EngramClient`` (sync) and ``AsyncEngramClient`` (async) call engram's REST API with the same methods;
both read ``ENGRAM_URL`` and ``ENGRAM_API_KEY`` when not given a URL or key, retry 429 and 503 answers
honouring ``Retry-After``, and raise a typed :class:`EngramError` subclass per status. Framework adapters
live in ``engram_client.langgraph`` (a LangGraph store) and ``engram_client.langchain`` (a retriever).
"""

from engram_client.async_client import AsyncEngramClient
from engram_client.client import EngramClient
from engram_client.errors import (
    AuthenticationError,
    BadRequestError,
    ConflictError,
    EngramConnectionError,
    EngramError,
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitError,
    ServerError,
    ServiceUnavailableError,
)
from engram_client.models import (
    Association,
    BatchResult,
    ForgetResult,
    HydrateResult,
    Job,
    Memory,
    MemoryHit,
    MemoryPage,
    SaveResult,
    SearchResponse,
)

__version__ = "0.1.0"
__all__ = [
    "AsyncEngramClient",
    "Association",
    "AuthenticationError",
    "BadRequestError",
    "BatchResult",
    "ConflictError",
    "EngramClient",
    "EngramConnectionError",
    "EngramError",
    "ForgetResult",
    "HydrateResult",
    "InvalidRequestError",
    "Job",
    "Memory",
    "MemoryHit",
    "MemoryPage",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RateLimitError",
    "SaveResult",
    "SearchResponse",
    "ServerError",
    "ServiceUnavailableError",
]
