"""The one settings object: every process reads the same ``ENGRAM_*`` environment variables."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ENGRAM_", extra="ignore")

    # Where embedded services, indexes and local state live.
    home: Path = Field(default_factory=lambda: Path("~/.engram").expanduser())

    # External services; empty means "start the embedded one under home" (serve) or
    # "use what serve wrote into home/runtime.json" (every other command).
    database_url: str = ""
    redis_url: str = ""
    # The embedded PostgreSQL's shared_buffers (e.g. "4GB"); empty: an eighth of RAM, 128MB..2GB.
    embedded_pg_shared_buffers: str = ""

    host: str = "127.0.0.1"
    port: int = 8000

    # Embeddings: a litellm "<provider>/<model>" name, or "local" for the bundled model.
    embedding_model: str = "local"
    embedding_batch_size: int = 64
    embedding_max_attempts: int = 5
    embedding_retry_base_seconds: float = 1.0
    # Resilience drill: the share of embedding calls that fail on purpose (core.embeddings.chaos).
    embedding_fault_rate: float = 0.0
    similarity_update_threshold: float = 0.9
    similarity_suggest_threshold: float = 0.75

    # Operator key sees every tenant in /v1/jobs, /v1/ops/coverage, /dashboard and /metrics.
    operator_key: str = ""

    # Secret used to encrypt datasource credentials at rest (Fernet key, urlsafe base64).
    secret_key: str = ""
    # Directories SQLite datasources may live under (a hosted deployment sets this; JSON list or
    # comma-separated). Empty: any readable SQLite file outside /proc, /sys and /dev.
    sqlite_roots: Annotated[list[Path], NoDecode] = Field(default_factory=list)

    @field_validator("sqlite_roots", mode="before")
    @classmethod
    def _split_roots(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    # Outbox: jobs queued longer than this without running are dispatched again by reconcile.
    outbox_redispatch_seconds: float = 30.0
    reconcile_interval_seconds: float = 15.0
    # A running job renews this lease (a heartbeat every quarter of it) while its worker lives; once it has
    # lapsed the worker is taken for dead and the job is dispatched again, so a killed worker costs seconds.
    job_running_lease_seconds: float = 20.0
    # Embed jobs larger than this are split into jobs of this size when they first run: a lost attempt
    # redoes one chunk, and the chunks spread over the worker's processes.
    embed_job_max_docs: int = 100
    # Redis redelivers an unacknowledged message (worker killed) after this long.
    broker_visibility_timeout_seconds: float = 3600.0
    api_workers: int = 1
    # Load (per API process). Requests running at once; more wait up to api_queue_wait_seconds in a queue
    # of at most api_max_queued, and the rest are answered 503 + Retry-After at once (no 5xx other than
    # that, no request left hanging). The database pool holds a connection for each running request
    # (a request never needs two) plus a few for probes and background threads.
    # Few running requests: Python threads share one GIL, so more of them only slow each other and the
    # event loop (which must keep answering probes and shedding) on a small machine.
    api_max_inflight: int = 12
    api_max_queued: int = 48
    api_queue_wait_seconds: float = 5.0
    db_pool_size: int = 16
    # How long a request waits for a pooled connection before a 503.
    db_pool_timeout_seconds: float = 10.0
    # PostgreSQL lock waits (row locks taken by writes) end with a 503 after this long.
    db_lock_timeout_seconds: float = 10.0
    # A transaction left idle this long is ended by PostgreSQL (a stuck client never pins locks).
    db_idle_in_transaction_seconds: float = 60.0
    # How long a catch-up waits for a tenant's full-text index lock before a 503.
    index_lock_wait_seconds: float = 10.0
    # Per-API-key request budget (0 disables): average requests a second and the burst allowed.
    rate_limit_per_second: float = 1000.0
    rate_limit_burst: float = 2000.0

    # Lifecycle.
    daily_ttl_hours: float = 72.0
    conversation_ttl_hours: float = 24.0
    importance_half_life_days: float = 30.0
    agent_entry_cap: int = 10_000
    # How often beat queues a `prune` pass (expiry, eviction, staleness, decay when due).
    prune_interval_seconds: float = 300.0
    # Decay is written to the rows at most this often (core.lifecycle.decay).
    importance_decay_interval_hours: float = 24.0

    # Search.
    dense_exact_max_docs: int = 20_000
    # Memories whose eligibility facts one process keeps in memory, over all tenants (~450 bytes each,
    # so ~90 MB at most; core.search.facts). A larger tenant is judged in SQL; 0 turns the cache off.
    search_facts_max_memories: int = 200_000

    @property
    def index_dir(self) -> Path:
        return self.home / "index"

    @property
    def runtime_file(self) -> Path:
        return self.home / "runtime.json"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


def reset_settings_cache() -> None:
    """Forget the cached settings (tests and `serve` change the environment before re-reading)."""
    get_settings.cache_clear()
