"""The one settings object: every process reads the same ``ENGRAM_*`` environment variables."""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

# Requests an API host runs at once, shared by its API processes (ENGRAM_API_WORKERS), and the fewest one
# process runs (Settings.api_inflight).
API_INFLIGHT_PER_HOST = 12
API_MIN_INFLIGHT = 4


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ENGRAM_", extra="ignore")

    # Where embedded services, indexes and local state live.
    home: Path = Field(default_factory=lambda: Path("~/.engram").expanduser())

    # External services; empty means "start the embedded one under home" (serve) or
    # "use what serve wrote into home/runtime.json" (every other command).
    database_url: str = ""
    redis_url: str = ""
    # The role API and workers connect as (row-level security applies to it). Empty: the database_url
    # with the user `engram_app` (password derived from the owner's), which `engram migrate` creates.
    app_database_url: str = ""
    # The embedded PostgreSQL's shared_buffers (e.g. "4GB"); empty: an eighth of RAM, 128MB..2GB.
    embedded_pg_shared_buffers: str = ""
    # Load pg_stat_statements (with planning times) into the embedded PostgreSQL: where its time goes, per
    # statement (scripts/pg_statements_load.py). Off by default: it costs a little on every statement.
    embedded_pg_statements: bool = False

    host: str = "127.0.0.1"
    port: int = 8000

    # Logs: JSON lines when stderr is not a terminal, readable lines when it is (core.logging).
    log_level: str = "INFO"
    # One line per HTTP request (method, path, route, status, duration, request id).
    access_log: bool = True
    # OpenTelemetry: traces are exported over OTLP/HTTP to this base URL (the standard
    # OTEL_EXPORTER_OTLP_ENDPOINT works too); unset, tracing is off and costs nothing.
    otlp_endpoint: str = ""

    # Embeddings: a litellm "<provider>/<model>" name, or "local" for the bundled model.
    embedding_model: str = "local"
    embedding_batch_size: int = 64
    # Resilience drill: the share of embedding calls that fail on purpose (core.embeddings.chaos).
    embedding_fault_rate: float = 0.0
    similarity_update_threshold: float = 0.9
    similarity_suggest_threshold: float = 0.75

    # Operator key sees every tenant in /v1/jobs, /v1/ops/coverage, /dashboard and /metrics.
    operator_key: str = ""

    # Secret used to encrypt datasource credentials at rest (Fernet key, urlsafe base64).
    secret_key: str = ""
    # Which datasources this process may open (core.source_guard): "hosted" refuses loopback,
    # private, link-local, CGNAT, multicast and metadata addresses and needs sqlite_roots for SQLite;
    # "local" (what `engram serve` sets) allows them. Empty: the mode of a running `engram serve` on this
    # home, else hosted. Engram's own database is refused in both.
    datasource_policy: Literal["", "hosted", "local"] = ""
    # Hosts a hosted server may still reach (JSON list or comma-separated): CIDRs ("10.1.0.0/16"), host
    # names ("db.internal", "*.db.internal") and PostgreSQL socket directories ("/var/run/postgresql").
    datasource_allow_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # Directories SQLite datasources may live under (JSON list or comma-separated). Hosted mode refuses
    # SQLite without them; local mode allows any readable SQLite file outside /proc, /sys, /dev and home.
    sqlite_roots: Annotated[list[Path], NoDecode] = Field(default_factory=list)

    @field_validator("datasource_policy", mode="before")
    @classmethod
    def _lower_policy(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("sqlite_roots", "datasource_allow_hosts", mode="before")
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
    # While saves keep coming, the outbox relay publishes at most one round per this many seconds, so the
    # embed jobs of a stream travel and run together (core.jobs.batches); a lone save is published at once.
    outbox_linger_seconds: float = 0.2
    # The outbox relay starts a round at most this often, however many commits notify it (core.jobs.relay).
    outbox_relay_spacing_seconds: float = 0.05
    reconcile_interval_seconds: float = 15.0
    # A failed job attempt is retried after base * 2^(attempt-1) seconds, capped at the max, with jitter
    # (workers.runner.backoff_seconds); after max_attempts it fails. The defaults ride out an outage of
    # about a day: 20 attempts, the delays doubling from 2 s to a 4 h ceiling.
    job_max_attempts: int = 20
    job_retry_base_seconds: float = 2.0
    job_retry_max_seconds: float = 4 * 3600.0
    # A running job renews this lease (a heartbeat every quarter of it) while its worker lives; once it has
    # lapsed the worker is taken for dead and the job is dispatched again, so a killed worker costs seconds.
    job_running_lease_seconds: float = 20.0
    # Embed jobs larger than this are split into jobs of this size when they first run: a lost attempt
    # redoes one chunk, and the chunks spread over the worker's processes.
    embed_job_max_docs: int = 100
    # Redis redelivers an unacknowledged message (worker killed) after this long.
    broker_visibility_timeout_seconds: float = 3600.0
    api_workers: int = 1
    # The most api_workers processes one tenant is served by, its connections in turn (api.serve.routed): a tenant
    # with more than its share of the connections takes a second one, so one busy tenant can use two cores; each
    # of its processes keeps its own copy of the tenant's caches. 1: every tenant in one process.
    api_processes_per_tenant: int = Field(default=2, ge=1)
    # Load (per API process). Requests running at once; more wait up to api_queue_wait_seconds in a queue
    # of at most api_max_queued, and the rest are answered 503 + Retry-After at once (no 5xx other than
    # that, no request left hanging). The database pool holds a connection for each running request
    # (a request never needs two) plus a few for probes and background threads.
    # Few running requests: Python threads share one GIL, so more of them only slow each other and the
    # event loop (which must keep answering probes and shedding) on a small machine. Unset: the host's
    # API_INFLIGHT_PER_HOST shared by its api_workers processes, at least API_MIN_INFLIGHT each (see
    # ``api_inflight``).
    api_max_inflight: int | None = None
    api_max_queued: int = 48
    api_queue_wait_seconds: float = 5.0
    db_pool_size: int = 16
    # How long a request waits for a pooled connection before a 503.
    db_pool_timeout_seconds: float = 4.0
    # PostgreSQL lock waits (row locks taken by writes) end with a 503 after this long.
    db_lock_timeout_seconds: float = 3.0
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
    # Cosine below which the dense channel does not rank a doc (core.search.dense). Unset (the default), each
    # embedder's own measured floor applies (`Embedder.similarity_floor`: 0.3 for the bundled model, lower for
    # models whose related texts score lower); set, it overrides that for every model.
    dense_similarity_floor: float | None = Field(default=None, ge=-1.0, le=1.0)
    # Tenants' full-text index handles one process keeps open (least recently used evicted; core.caches).
    fulltext_max_open_indexes: int = 1_000
    # Tenants whose catalog snapshot (and what search derives from it) one process keeps, and the MB they
    # may take (estimated per catalog entity, core.search.catalog): a reload costs a warm search ~2-5 ms.
    catalog_cache_tenants: int = 1_000
    catalog_cache_max_mb: int = 256
    # Tenants' in-process vector matrices (exact dense path) one process keeps: at most this many tenants
    # and this many MB of vectors (a 1,000-memory tenant at 384 dims is ~1.6 MB).
    dense_cache_max_tenants: int = 1_000
    dense_cache_max_mb: int = 512
    # Memories whose eligibility facts one process keeps in memory, over all tenants (~450 bytes each,
    # so ~90 MB at most; core.search.facts). A larger tenant is judged in SQL; 0 turns the cache off.
    search_facts_max_memories: int = 200_000

    # Operating tenants (core.tenancy.operations). Quotas a new tenant gets when its creation names none
    # (unset: unlimited); an operator changes a tenant's with PATCH /v1/tenants/{name}.
    default_max_memories: int | None = Field(default=None, ge=0)
    default_max_datasources: int | None = Field(default=None, ge=0)
    default_requests_per_minute: int | None = Field(default=None, ge=1)
    default_embedding_texts_per_day: int | None = Field(default=None, ge=0)
    # API processes buffer usage counts and flush them this often (usage is current within a minute).
    usage_flush_seconds: float = Field(default=5.0, gt=0)
    # How often beat measures the storage of tenants whose data changed since their last measurement.
    usage_storage_interval_seconds: float = Field(default=60.0, gt=0)
    # Addresses (IPs or CIDR networks, comma-separated) of the proxies or load balancers in front of the
    # API whose X-Forwarded-For / X-Forwarded-Proto headers are believed; empty: none, the peer address is
    # the client's. "*" believes any peer (only behind a proxy that always overwrites the headers).
    trusted_proxies: str = ""
    # Rows an offboarding's purge deletes per transaction (each chunk commits: a killed purge resumes).
    purge_chunk_rows: int = Field(default=5_000, ge=1)

    # Audit log and webhooks (core.audit, core.webhooks).
    # Audit entries older than this are removed by the prune job (at least one day: the database refuses less).
    audit_retention_days: float = Field(default=365.0, ge=1.0)
    # One delivery attempt's HTTP timeout (connect, each read and write).
    webhook_timeout_seconds: float = 10.0
    # Attempts of one delivery before it is given up (each retry after an exponential backoff with jitter).
    webhook_max_attempts: int = Field(default=8, ge=1)
    webhook_retry_base_seconds: float = 5.0
    webhook_retry_max_seconds: float = 3600.0
    # A webhook failing without a success for this long is disabled (and its tenant's audit log says so).
    webhook_disable_after_seconds: float = 3 * 86400.0
    # How often beat looks for deliveries whose retry is due.
    webhook_sweep_interval_seconds: float = 5.0
    # One delivery job stops after this long and queues a follow-up, so a slow receiver holds a worker slot
    # for bounded stretches only.
    webhook_job_seconds: float = 10.0
    # Finished deliveries (succeeded or given up) older than this are removed by the prune job.
    webhook_delivery_retention_days: float = 30.0

    # Bounded database waits (core.dbwaits). An API statement gets this long, then the request a 503 with
    # Retry-After (the client gives up on a server that does not answer at all half a second later).
    db_statement_timeout_seconds: float = 4.0
    # An import of a whole export is one statement per batch of memories: it gets this long instead.
    db_import_statement_timeout_seconds: float = 120.0
    # Opening a connection to a server that accepts TCP but never answers ends after this long.
    db_connect_timeout_seconds: float = 3.0
    # The app role's defaults (set by `migrate`): what any process connecting as it gets unless it sets
    # its own, as the API does. Workers run jobs under these.
    db_role_statement_timeout_seconds: float = 600.0
    db_role_lock_timeout_seconds: float = 60.0
    db_role_idle_in_transaction_seconds: float = 600.0

    # Graceful shutdown (api.serve.graceful). Idle keep-alive connections are kept this long, longer than
    # clients keep theirs (httpx 5 s, aiohttp 15 s, Node 5 s), so the client is the side that closes one.
    api_keep_alive_seconds: int = 75
    # On SIGTERM: how long connections stay open to answer (with Connection: close) what clients send on
    # them, then how long running requests may take to finish.
    api_drain_seconds: float = 6.0
    api_shutdown_timeout_seconds: int = 30

    # Fair job scheduling (core.jobs.relay, core.jobs.lanes). An embed job of at most this many docs queued by
    # a write is interactive (its own queue and worker process); everything else is bulk.
    interactive_max_docs: int = 1
    # Jobs the relays keep published but unfinished per lane, over the cluster. The relay claims round-robin
    # over tenants whenever a slot frees, so another tenant's new job waits behind at most this many; set it
    # to about twice the lane's worker slots (all bulk workers' concurrency) so no slot idles between jobs.
    relay_bulk_inflight: int = 6
    relay_interactive_inflight: int = 200
    # Ingest and sample-refresh jobs of one tenant running at once (a slow source holds at most this many).
    tenant_ingest_concurrency: int = 1
    tenant_refresh_concurrency: int = 1
    # Threads of the interactive worker process that `engram worker` starts next to the bulk one.
    worker_interactive_concurrency: int = 1
    # Background reindexing after a model change (core.embeddings.reindex): texts a second its jobs may
    # carry, averaged over 10 s (0: as fast as the bulk lane goes). A provider's rate limit belongs here.
    reindex_max_texts_per_second: float = 0.0

    @property
    def api_inflight(self) -> int:
        """Requests one API process runs at once: ``api_max_inflight`` when set, else the host's share.

        One process runs 12 at once: fewer leave its interpreter idle while requests wait on PostgreSQL (4 or
        6 served 6-20% fewer requests a second). Four processes of 12 each on two cores ran 48 threads that
        took turns at the cores and their caches: under the load mix over four tenants, 4 each cost 2.02-2.27 s
        of API CPU per 1,000 requests against 2.40-2.90 with 12, and served 490-550 requests/s against 380-446.
        """
        if self.api_max_inflight is not None:
            return self.api_max_inflight
        return max(API_MIN_INFLIGHT, math.ceil(API_INFLIGHT_PER_HOST / max(self.api_workers, 1)))

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
