"""`engram bench load`: many clients against one running API, the way agents would hit it.

Each client loops for the run's length: 60% searches, 30% saves, 10% gets of a memory saved earlier. A 503
is answered as a well-behaved client would: it waits the ``Retry-After`` it was given (at most
``MAX_BACKOFF`` seconds) before its next request. Requests time out after ``UNANSWERED_AFTER`` seconds and
are counted as unanswered. A separate sampler reads ``/healthz`` every half second during the run.
Afterwards every save that was acknowledged (201) is read back: one that is missing is a lost write.

With ``tenants`` > 1 (a throwaway serve only) the clients are spread over that many tenants, each with its own
admin key and seed: how a hosted engram is loaded, and what ``ENGRAM_API_WORKERS`` routes by (api.serve.routed).
With ``replicas`` > 1 the throwaway serve gets that many API replicas in all, each an `engram api` with a home of
its own on the serve's PostgreSQL and Redis, and each tenant's clients go to one of them (tenant n to replica n
mod R): what a load balancer that hashes the ``Authorization`` header does with keys spread evenly
(deploy/SCALING.md). The API's CPU is then that of every replica.

Only loopback is ever contacted: the target must be ``http://127.0.0.1:<port>``, so a mistyped URL cannot
turn this into a load test of someone else's server. Counts and time are bounded.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import aiohttp
import httpx
import uvloop

from api.bench import figure, machine_speed_ms
from api.bench.stack import BenchStack, api_server, stopped_by_sigterm
from api.serve.embedded import free_port
from api.serve.stack import api_workers
from core.config import get_settings
from core.runtime import engram_command, read_runtime

MAX_CLIENTS = 1000
MAX_TENANTS = 100
MAX_REPLICAS = 8
MAX_SECONDS = 600
MAX_RATE = 100_000.0
UNANSWERED_AFTER = 30.0
MAX_BACKOFF = 5.0
HEALTH_EVERY = 0.5
SEED_MEMORIES = 200
MIX = (("search", 0.6), ("save", 0.3), ("get", 0.1))
_WORDS = (
    "orders revenue refunds cents customer region churn weekly monthly fiscal quarter net gross margin "
    "warehouse shipment delay status paid pending cancelled timezone utc dashboard metric filter join"
).split()


class NotLoopback(ValueError):
    """The target is not http://127.0.0.1:<port>."""


def check_loopback(url: str) -> str:
    """The base URL when it names 127.0.0.1 over plain HTTP, else NotLoopback."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname != "127.0.0.1" or parts.port is None:
        raise NotLoopback(f"bench load only targets http://127.0.0.1:<port>, not {url!r}")
    if parts.username or parts.password or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise NotLoopback(f"give the bare base URL http://127.0.0.1:<port>, not {url!r}")
    return f"http://127.0.0.1:{parts.port}"


@dataclass
class Tally:
    statuses: Counter[str] = field(default_factory=Counter)
    # Latency of answered requests by operation (503s apart: a shed request is answered without running).
    latency: dict[str, list[float]] = field(default_factory=lambda: {op: [] for op, _ in MIX})
    busy_ms: list[float] = field(default_factory=list)
    saved: list[str] = field(default_factory=list)
    unanswered: int = 0
    errors: int = 0
    health_ms: list[float] = field(default_factory=list)
    health_failures: int = 0
    # Answers other than 2xx by status and error message (what a 503 says tells shedding from a busy database).
    refusals: Counter[str] = field(default_factory=Counter)

    @property
    def requests(self) -> int:
        return sum(self.statuses.values())


def _note(rng: random.Random) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(8, 24)))


def _pick(rng: random.Random) -> str:
    roll, total = rng.random(), 0.0
    for op, share in MIX:
        total += share
        if roll < total:
            return op
    return MIX[-1][0]


async def _one(http: aiohttp.ClientSession, op: str, rng: random.Random, tally: Tally, mine: _Tenant) -> float:
    """One request; returns how long to back off before the next."""
    started = time.perf_counter()
    try:
        if op == "search":
            words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 5)))
            sent = http.post("/v1/search", json={"question": f"what about {words}?"})
        elif op == "save":
            sent = http.post("/v1/memories", json={"content": _note(rng)})
        else:
            sent = http.get(f"/v1/memories/{rng.choice(mine.saved or mine.seeded)}")
        async with sent as response:
            status, body = response.status, await response.read()
            retry_after = response.headers.get("retry-after", "1")
    except TimeoutError:  # (aiohttp's timeouts are TimeoutErrors, its read timeout a ClientError as well)
        tally.unanswered += 1
        return 0.0
    except aiohttp.ClientError:
        tally.errors += 1
        return 0.5
    elapsed_ms = (time.perf_counter() - started) * 1000
    (tally.busy_ms if status == 503 else tally.latency[op]).append(elapsed_ms)
    tally.statuses[str(status)] += 1
    if status >= 300:
        tally.refusals[f"{status} {_message(body)}"] += 1
    if op == "save" and status == 201:
        tally.saved.append(json.loads(body)["memory_id"])
        mine.saved.append(tally.saved[-1])
    if status in (429, 503):
        try:
            return min(float(retry_after), MAX_BACKOFF)
        except ValueError:
            return 1.0
    return 0.0


def _message(body: bytes) -> str:
    """The error message of an engram error body (its raw start when it is not one)."""
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body[:80].decode(errors="replace")


@dataclass
class _Tenant:
    key: str
    url: str  # the API replica its clients are sent to
    seeded: list[str] = field(default_factory=list)
    saved: list[str] = field(default_factory=list)  # acknowledged saves, read back with this key after the run


def _session(url: str, *, connections: int = 1, **settings: Any) -> aiohttp.ClientSession:
    """An HTTP client of ``url`` holding at most ``connections`` connections, kept alive; a request unanswered after
    UNANSWERED_AFTER seconds times out. (aiohttp, not httpx: the load generator shares the machine with the
    stack it measures, and httpx's client cost it ~3x the CPU a request.)"""
    return aiohttp.ClientSession(
        base_url=url,
        connector=aiohttp.TCPConnector(limit=connections),
        timeout=aiohttp.ClientTimeout(total=UNANSWERED_AFTER),
        **settings,
    )


async def _client(mine: _Tenant, seed: int, deadline: float, tally: Tally, *, interval: float | None = None) -> None:
    """One client's requests until ``deadline``, each sent as soon as the last was answered; with ``interval``
    (paced), each at least ``interval`` seconds after the one before, the clients' first ones spread over the
    first interval."""
    # Its own HTTP client and connection, as each agent has (and one shared pool would make each request
    # look through every client's connections).
    rng = random.Random(seed)
    due = time.monotonic() + (rng.random() * interval if interval else 0.0)
    async with _session(mine.url, headers={"Authorization": f"Bearer {mine.key}"}) as http:
        while time.monotonic() < deadline:
            if interval:
                if (wait := due - time.monotonic()) > 0:
                    # (Looked at again after the sleep: the loop's clock may wake it a little before either time.)
                    await asyncio.sleep(min(wait, max(0.0, deadline - time.monotonic())))
                    continue
                # The next request at least an interval after this one: a client behind its pace (its last answer
                # came late) does not catch up with a burst, so the offered rate is at most the one given.
                due = max(due, time.monotonic()) + interval
            backoff = await _one(http, _pick(rng), rng, tally, mine)
            if backoff:
                await asyncio.sleep(min(backoff * (0.5 + rng.random()), max(0.0, deadline - time.monotonic())))


async def _health(url: str, deadline: float, tally: Tally) -> None:
    # Its own client and connection: a probe must not queue behind the load's connections.
    async with _session(url) as http:
        while time.monotonic() < deadline:
            started = time.perf_counter()
            try:
                async with http.get("/healthz") as response:
                    await response.read()
                    ok = response.status == 200
            except (TimeoutError, aiohttp.ClientError):
                ok = False
            tally.health_ms.append((time.perf_counter() - started) * 1000)
            tally.health_failures += 0 if ok else 1
            await asyncio.sleep(HEALTH_EVERY)


async def _verify(url: str, key: str, ids: list[str]) -> Counter[str]:
    """Why acknowledged saves cannot be read back, counted (empty: every one was): the last status a read got
    (each is retried on 503 until it answers), or ``error`` when it never got one."""
    gate = asyncio.Semaphore(8)

    async def missing(http: aiohttp.ClientSession, memory_id: str) -> str | None:
        async with gate:
            status: int | None = None
            for _ in range(20):
                try:
                    async with http.get(f"/v1/memories/{memory_id}") as response:
                        await response.read()
                        status = response.status
                except (TimeoutError, aiohttp.ClientError):
                    await asyncio.sleep(1)
                    continue
                if status == 200:
                    return None
                if status not in (429, 503):
                    return str(status)
                await asyncio.sleep(1)
            return "error" if status is None else str(status)

    async with _session(url, connections=8, headers={"Authorization": f"Bearer {key}"}) as http:
        return Counter(reason for reason in await asyncio.gather(*(missing(http, i) for i in ids)) if reason)


async def _seed(url: str, key: str, count: int) -> list[str]:
    rng = random.Random(0)
    items = [{"content": _note(rng)} for _ in range(count)]
    async with _session(url, headers={"Authorization": f"Bearer {key}"}) as http:
        async with http.post("/v1/memories:batch", json={"items": items}) as response:
            response.raise_for_status()
            answer = await response.json()
    return [r["memory_id"] for r in answer["results"] if "memory_id" in r]


def _listening_inodes(port: int) -> set[str]:
    """The socket inodes listening on ``port`` (any address), from /proc/net/tcp and tcp6."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def api_processes(port: int) -> list[int]:
    """The processes holding the API's listening socket and those they started: with ``ENGRAM_API_WORKERS=N``,
    the router and its N processes (api.serve.routed). Only this user's processes can be seen."""
    wanted = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    holders = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in wanted for fd in (entry / "fd").iterdir()):
                holders.append(int(entry.name))
        except OSError:  # gone, or another user's
            continue
    routed = {pid for holder in holders for pid in descendants(holder) if _routed(pid)}
    return sorted({*holders, *routed})


def _routed(pid: int) -> bool:
    """An API process its router passes connections to (it holds no listening socket of its own)."""
    try:
        return b"--handoff-fd" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def descendants(root: int) -> list[int]:
    """``root`` and every process below it (from each process's parent in /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


# What a process of the stack is, by its command line (the first pattern that matches).
_ROLES = (
    ("postgresql", re.compile(r"(^|/)postgres\b|postgres:")),
    ("redis", re.compile(r"valkey|redis-server")),
    ("workers", re.compile(r"\bworker\b|celery")),
    ("beat", re.compile(r"\bbeat\b")),
)


def role_of(pid: int, api: set[int]) -> str:
    if pid in api:
        return "api"
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "other"
    return next((role for role, pattern in _ROLES if pattern.search(command)), "other")


def cpu_by_role(root: int | None, api: list[int]) -> dict[str, float]:
    """CPU seconds used so far by the processes of the stack under ``root`` (its PostgreSQL, Redis, workers,
    beat, API; the supervising process counts as ``other``), and by this process as ``client``."""
    totals: dict[str, float] = {}
    api_pids = set(api)
    for pid in api_pids | (set(descendants(root)) if root is not None else set()):
        role = role_of(pid, api_pids)
        totals[role] = totals.get(role, 0.0) + cpu_seconds([pid])
    totals["client"] = time.process_time()
    return totals


def serving_stack(url: str) -> int | None:
    """The `engram serve` process that runs the API at ``url`` (the parent of its API process), so the run
    can tell its PostgreSQL, Redis and workers apart; None for an API started some other way."""
    for pid in api_processes(int(urlsplit(url).port or 0)):
        fields = _stat(pid)
        parent = int(fields[1]) if fields else 0
        try:
            command = Path(f"/proc/{parent}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in command and any(part.endswith(b"engram") or part == b"api.cli" for part in command):
            return parent
    return None


def machine_cpu_seconds() -> float:
    """CPU seconds every core of the machine has spent busy so far (all processes, from /proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU the processes have used so far (those still running)."""
    ticks, total = os.sysconf("SC_CLK_TCK"), 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / ticks


@dataclass
class Usage:
    """CPU seconds during the clients' run: the API processes', each role's of the stack, the machine's."""

    api: float
    api_processes: int
    roles: dict[str, float]
    machine: float


async def _run(
    urls: list[str], keys: list[str], *, clients: int, seconds: float, root: int | None, rate: float | None = None
) -> tuple[Tally, Counter[str], Usage]:
    """The tally, the lost writes (by why their read-back failed), and the CPU used during the clients' run
    (client n uses key n mod K, key k is sent to the API at ``urls[k mod R]``; with ``rate``, the clients together
    send at most that many requests a second)."""
    pids = sorted({pid for url in urls for pid in api_processes(int(urlsplit(url).port or 0))})
    tenants = [_Tenant(key, urls[n % len(urls)]) for n, key in enumerate(keys)]
    for tenant in tenants:
        tenant.seeded = await _seed(tenant.url, tenant.key, SEED_MEMORIES)
    tally = Tally()
    cpu_before, roles_before, machine_before = cpu_seconds(pids), cpu_by_role(root, pids), machine_cpu_seconds()
    interval = clients / rate if rate else None  # (each client's share of the rate)
    deadline = time.monotonic() + seconds
    await asyncio.gather(
        *(_health(url, deadline, tally) for url in urls),
        *(_client(tenants[n % len(tenants)], n, deadline, tally, interval=interval) for n in range(clients)),
    )
    roles = {role: spent - roles_before.get(role, 0.0) for role, spent in cpu_by_role(root, pids).items()}
    usage = Usage(cpu_seconds(pids) - cpu_before, len(pids), roles, machine_cpu_seconds() - machine_before)
    lost: Counter[str] = Counter()
    for tenant in tenants:
        lost += await _verify(tenant.url, tenant.key, tenant.saved)
    return tally, lost, usage


def _p(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1]


def run(
    *,
    url: str | None,
    key: str | None,
    clients: int,
    seconds: float,
    log: Callable[[str], None],
    tenants: int = 1,
    rate: float | None = None,
    replicas: int = 1,
) -> list[dict]:
    """Figures of one load run against ``url`` (or a throwaway `engram serve` started for it, with ``replicas``
    API replicas in all); ``rate``: the clients pace themselves to that many requests a second in all (None: each
    sends as soon as answered)."""
    if not 1 <= clients <= MAX_CLIENTS:
        raise ValueError(f"clients must be 1..{MAX_CLIENTS}")
    if not 1 <= tenants <= min(MAX_TENANTS, clients):
        raise ValueError(f"tenants must be 1..{MAX_TENANTS} and at most the clients")
    if tenants > 1 and url is not None:
        raise ValueError("--tenants needs the throwaway serve (without --url): it creates the tenants")
    if not 1 <= replicas <= min(MAX_REPLICAS, tenants):
        raise ValueError(f"replicas must be 1..{MAX_REPLICAS} and at most the tenants (each tenant goes to one)")
    if not 0 < seconds <= MAX_SECONDS:
        raise ValueError(f"seconds must be in (0, {MAX_SECONDS}]")
    if rate is not None and not 0 < rate <= MAX_RATE:
        raise ValueError(f"rate must be in (0, {MAX_RATE}] requests a second")
    if url is not None:
        url = check_loopback(url)
        if not key:
            raise ValueError("give the tenant API key (--key or ENGRAM_API_KEY) with --url")
        return figures_of([url], [key], clients=clients, seconds=seconds, log=log, root=serving_stack(url), rate=rate)
    with throwaway_serve(log=log) as served, served.more_replicas(replicas - 1, log=log) as others:
        keys = served.tenant_keys(tenants)
        urls = [served.url, *others]
        return figures_of(urls, keys, clients=clients, seconds=seconds, log=log, root=served.pid, rate=rate)


class Served(NamedTuple):
    """A throwaway `engram serve`: its URL, the default tenant's admin key, its process id, the operator key,
    its home."""

    url: str
    admin_key: str
    pid: int
    operator_key: str
    home: Path

    def replica_settings(self) -> dict[str, str]:
        """What another API replica of this serve is started with: its database and Redis, its datasource policy,
        operator and secret keys, and as many API processes as the serve gives its own (`more_replicas`)."""
        runtime = read_runtime(self.home)
        if runtime is None:
            raise RuntimeError("the serve has no runtime record to start replicas from")
        return {
            "ENGRAM_DATABASE_URL": runtime["database_url"],
            "ENGRAM_REDIS_URL": runtime["redis_url"],
            "ENGRAM_DATASOURCE_POLICY": runtime["datasource_policy"],
            "ENGRAM_OPERATOR_KEY": self.operator_key,
            "ENGRAM_SECRET_KEY": (self.home / "secret_key").read_text().strip(),
            "ENGRAM_API_WORKERS": str(api_workers(get_settings())),
        }

    def more_replicas(self, count: int, *, log: Callable[[str], None]) -> AbstractContextManager[list[str]]:
        """``count`` more API replicas of this serve, until the block ends (`more_replicas`)."""
        if count <= 0:
            return nullcontext([])
        return more_replicas(self.replica_settings(), self.home.parent, count, log=log)

    def tenant_keys(self, tenants: int) -> list[str]:
        """Admin keys of ``tenants`` tenants: the default one, and new ones made with the operator key."""
        operator = {"Authorization": f"Bearer {self.operator_key}"}
        keys = [self.admin_key]
        for n in range(2, tenants + 1):
            made = httpx.post(f"{self.url}/v1/tenants", json={"name": f"load-{n}"}, headers=operator, timeout=60)
            made.raise_for_status()
            keys.append(made.json()["api_key"])
        return keys


def figures_of(
    urls: list[str],
    keys: list[str],
    *,
    clients: int,
    seconds: float,
    log: Callable[[str], None],
    root: int | None,
    rate: float | None = None,
) -> list[dict]:
    speed = machine_speed_ms()
    paced = f", paced to {rate:g} requests/s" if rate else ""
    log(f"load: {clients} clients of {len(keys)} tenant(s) for {seconds:g} s against {', '.join(urls)}{paced}")
    started = time.monotonic()
    tally, lost, usage = uvloop.run(_run(urls, keys, clients=clients, seconds=seconds, root=root, rate=rate))
    elapsed = time.monotonic() - started
    for refusal, n in tally.refusals.most_common():
        log(f"answered {n} times: {refusal}")
    params: dict[str, Any] = {"clients": clients, "seconds": seconds, "tenants": len(keys)}
    if rate:
        params["rate"] = rate
    if len(urls) > 1:
        params["replicas"] = len(urls)
    out = [
        figure("load", "requests", tally.requests, "count", **params),
        figure("load", "requests_per_s", tally.requests / max(seconds, 1e-9), "1/s", **params),
        # CPU of every process holding an API's socket (all N workers of every replica), per 1,000 answered
        # requests: the figure that must not grow with ENGRAM_API_WORKERS or replicas. 0 processes: none of this user's.
        figure("load", "api_processes", usage.api_processes, "count", **params),
        figure("load", "api_cpu_s_per_1000", usage.api * 1000 / max(tally.requests, 1), "s", **params),
    ]
    # Where a request's CPU goes on this machine: each part of the stack (a throwaway serve's; with --url only
    # the API and this client are known), this load generator, and every core's busy time (others' work too).
    per_1000 = 1000 / max(tally.requests, 1)
    for role in ("postgresql", "workers", "redis", "beat", "other", "client"):
        if role in usage.roles:
            out.append(figure("load", f"{role}_cpu_s_per_1000", max(usage.roles[role], 0.0) * per_1000, "s", **params))
    out.append(figure("load", "machine_cpu_s_per_1000", usage.machine * per_1000, "s", **params))
    out += [figure("load", f"status_{code}", n, "count", **params) for code, n in sorted(tally.statuses.items())]
    for op, _ in MIX:
        values = tally.latency[op]
        out.append(figure("load", f"{op}_p50_ms", _p(values, 0.5), "ms", **params))
        out.append(figure("load", f"{op}_p95_ms", _p(values, 0.95), "ms", **params))
    out += [
        figure("load", "busy_503_p50_ms", _p(tally.busy_ms, 0.5), "ms", **params),
        figure("load", "busy_503_p95_ms", _p(tally.busy_ms, 0.95), "ms", **params),
        figure("load", "saves_acknowledged", len(tally.saved), "count", **params),
        figure("load", "lost_writes", sum(lost.values()), "count", **params),
        # (Why each lost write's read-back failed: its last status, or ``error`` when it got none.)
        *(figure("load", f"lost_writes_{reason}", n, "count", **params) for reason, n in sorted(lost.items())),
        figure("load", "healthz_max_ms", max(tally.health_ms, default=0.0), "ms", **params),
        figure("load", "healthz_failures", tally.health_failures, "count", **params),
        figure("load", "unanswered_30s", tally.unanswered, "count", **params),
        figure("load", "connection_errors", tally.errors, "count", **params),
        figure("load", "wall_seconds", elapsed, "s", **params),
        figure("load", "machine_speed_ms", speed, "ms", **params),
    ]
    return out


def _api_settings_only() -> dict[str, str]:
    """This process's environment for a throwaway stack's processes: without the ENGRAM_* settings (its own stack,
    not the services they may name) but the API process's own (ENGRAM_API_*: its processes, in-flight bound,
    keep-alive), so a run can compare them."""
    return {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_") or k.startswith("ENGRAM_API_")}


@contextmanager
def throwaway_serve(*, log: Callable[[str], None], env: dict[str, str] | None = None) -> Iterator[Served]:
    """`engram serve` on a temporary home and a free port, until the block ends (a SIGTERM ends it too);
    ``env``: settings of its own."""
    with stopped_by_sigterm():
        yield from _throwaway_serve(log=log, env=env)


def _throwaway_serve(*, log: Callable[[str], None], env: dict[str, str] | None) -> Iterator[Served]:
    base = Path(tempfile.mkdtemp(prefix="engram-load-", dir="/tmp"))
    base.chmod(0o755)
    port = free_port()
    env = {**_api_settings_only(), **(env or {})}
    out_path = base / "serve.out"
    with open(out_path, "w") as out:
        process = subprocess.Popen(
            [*engram_command(), "serve", "--port", str(port), "--home", str(base / "home")],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 120
            text = ""
            while time.monotonic() < deadline and process.poll() is None:
                text = out_path.read_text()
                if "Press Ctrl-C" in text:
                    break
                time.sleep(0.2)
            found = re.search(r"admin key \(shown once\): (\S+)", text)
            if found is None:
                raise RuntimeError(f"engram serve did not start:\n{text[-2000:]}")
            log(f"started engram serve on port {port} (home {base / 'home'})")
            operator_key = (base / "home" / "operator_key").read_text().strip()
            yield Served(f"http://127.0.0.1:{port}", found.group(1), process.pid, operator_key, base / "home")
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=90)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            shutil.rmtree(base, ignore_errors=True)


@contextmanager
def more_replicas(
    settings: dict[str, str], base: Path, count: int, *, log: Callable[[str], None]
) -> Iterator[list[str]]:
    """``count`` more API replicas on the services ``settings`` name (a throwaway serve's:
    `Served.replica_settings`), until the block ends; yields their URLs.

    Each is an `engram api` on a free port with a home of its own under ``base`` (so its own full-text index
    directory and caches), as replicas behind a load balancer run; this shell's ENGRAM_API_* settings apply to
    each as they do to the serve's API, and ``settings`` win over them."""
    inherited = _api_settings_only()
    with ExitStack() as started:
        urls = []
        for n in range(2, count + 2):
            home = Path(tempfile.mkdtemp(prefix=f"replica-{n}-", dir=base))
            replica = BenchStack(home=home, env={**inherited, **settings, "ENGRAM_HOME": str(home)})
            url, _ = started.enter_context(api_server(replica, port=free_port(), inherit=False))
            log(f"started API replica {n} at {url} (home {home})")
            urls.append(url)
        yield urls
