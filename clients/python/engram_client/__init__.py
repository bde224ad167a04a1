"""Python SDK for engram, the memory service for AI agents.

``EngramClient`` (sync) and ``AsyncEngramClient`` (async) call engram's REST API with the same methods;
both read ``ENGRAM_URL`` and ``ENGRAM_API_KEY`` when not given a URL or key, retry 429 and 503 answers
honouring ``Retry-After``, and raise a typed :class:`EngramError` subclass per status. Framework adapters
live in ``engram_client.langgraph`` (a LangGraph store) and ``engram_client.langchain`` (a retriever).

Every REST call of engram has a method (memories with their history, export and import, runs, search, the
catalog, jobs, keys, operations, tenants and usage); ``request`` makes any other call with the same key,
retries and typed errors, its answer parsed as the pydantic model you name.
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
from engram_client.resources import (
    ApiKey,
    CoverageRow,
    Datasource,
    Deleted,
    ImportResult,
    IssuedKey,
    JobAccepted,
    JobPage,
    KeyRevoked,
    MemoryHistory,
    MemoryVersion,
    ModelInspection,
    ProvisionedTenant,
    Quotas,
    RunEnded,
    Tenant,
    TenantPage,
    Usage,
    UsageReport,
)

__version__ = "0.1.0"
__all__ = [
    "ApiKey",
    "Association",
    "AsyncEngramClient",
    "AuthenticationError",
    "BadRequestError",
    "BatchResult",
    "ConflictError",
    "CoverageRow",
    "Datasource",
    "Deleted",
    "EngramClient",
    "EngramConnectionError",
    "EngramError",
    "ForgetResult",
    "HydrateResult",
    "ImportResult",
    "InvalidRequestError",
    "IssuedKey",
    "Job",
    "JobAccepted",
    "JobPage",
    "KeyRevoked",
    "Memory",
    "MemoryHistory",
    "MemoryHit",
    "MemoryPage",
    "MemoryVersion",
    "ModelInspection",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "ProvisionedTenant",
    "Quotas",
    "RateLimitError",
    "RunEnded",
    "SaveResult",
    "SearchResponse",
    "ServerError",
    "ServiceUnavailableError",
    "Tenant",
    "TenantPage",
    "Usage",
    "UsageReport",
]
