"""Several API processes on one port, each API key's connections served by one of them.

Every API process answers every tenant correctly: before a search it catches its caches up from PostgreSQL
(core.search.index). But a process's caches of a tenant (the full-text reader and the changes on top of it,
the vector matrix, the eligibility facts) cost work per change of that tenant, so when the kernel hands
connections to any process, every process repeats that work for every tenant: measured on one tenant,
CPU per request 1.11-1.25x at 2 processes and 1.31-1.45x at 4 (docs/benchmarks.md, Processes).

So with ``ENGRAM_API_WORKERS=N`` (N > 1) the ``engram api`` process does not serve: it holds the listening
socket and, for each new connection, reads the head of its first request without taking it off the socket
(``MSG_PEEK``), picks the process that owns the request's API key and passes the connection's file
descriptor to that process (``SCM_RIGHTS`` over a Unix socket pair). The process serves the connection from
its first byte as if it had accepted it: nothing is copied or proxied, and the router spends a few syscalls
per connection, none per request.

A tenant is served by the process its id names (tenant id modulo N), and a busy one by the next process too
(``ENGRAM_API_PROCESSES_PER_TENANT``, at most 2 by default), its new connections then passed to each in turn.
One process keeps a tenant's caches once, but its interpreter lock bounds the tenant's requests at one core:
one tenant's load mix ran 1.13-1.23x the requests/s on two processes, at 0.98-1.07x the CPU a request
(docs/benchmarks.md, Load). Tenants sharing the load evenly gain nothing by it and pay for the second copies
of their caches (four tenants on four processes, each on two: no more requests/s than each on one,
docs/benchmarks.md, Processes), so a tenant takes more processes only for its share of the connections the
router passed lately (:class:`Shares`): about one process per 1/N of them. A key is known to be its tenant's
once a process that authenticated it tells the router the key's tenant (the key's CRC-32 and the tenant id,
over the same socket pair), so a tenant whose agents use many keys is still served by its processes; until
then its connections go to the process the key's hash names. A load balancer in front of replicas cannot know
the tenant and hashes the header instead (deploy/SCALING.md).

Each process caches its keys' callers and counts its tenants' usage before writing it. A process through which a
tenant's keys or state change (a revocation, a suspension, new quotas, an offboarding) has the router ask every
other live process to drop the tenant's callers, and one about to read usage has them write what they counted; it
waits for each to say it did before it answers (:func:`ask_the_others`): the change applies to the next request
whichever process serves it, and the usage read counts every process's requests. The database's notification
(api.tenant_events) still reaches them too, and is what reaches other replicas.

A connection without a key in its first request (``/healthz``, the dashboard's page) goes to the processes
in turn. Later requests on a keep-alive connection stay with the process that has it: a client using
several keys on one connection is served correctly, by one process. A process that dies is started again;
meanwhile its connections go to the next live one.

A process acknowledges each connection it takes off the socket pair, and the router keeps its own copy of a
connection until then: a process killed with connections still queued to it (sent, not taken) has them
passed to the next live process, which serves them from their first byte as well (nothing of theirs was
read). Only connections a process had taken die with it, as they would with a process that listened.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import click
import uvicorn

from api.serve.graceful import DrainingServer
from api.serve.supervise import die_with_parent, restart_delay

log = logging.getLogger("engram.api")

# The head of a first request is routed once its Authorization line has arrived, or the whole head, or this
# many bytes (a head that big has no such line within them), or after PEEK_SECONDS (a client that connects
# and waits is served by whichever process is next; it is answered as usual).
PEEK_BYTES = 16384
PEEK_SECONDS = 0.5
# How often a head that is not complete yet is looked at again (its socket stays readable while unread).
_REPEEK_SECONDS = 0.002


# What a process tells its router, one message each: b"t", a key's CRC-32 and its tenant id (the key belongs to the
# tenant); b"a", a count and 0 (it took that many more of the connections passed to it); a request to the other
# processes (FORGET, FLUSH_USAGE), a number of its own and a tenant id; b"k", the router's number of such a request
# and the tenant id (done here). What a router tells a process: b"c" with a connection's descriptor; a request, the
# router's number for it and the tenant id (do it, then say b"k"); b"d", the process's own number of its request
# and the tenant id (every other process did it).
_LEARNED = struct.Struct("!cIq")
# The requests a process makes of the others: drop a tenant's cached callers; write the usage counted so far.
FORGET = b"f"
FLUSH_USAGE = b"u"
_REQUESTS = (FORGET, FLUSH_USAGE)
# How long a process waits for the others to do what it asked (one that does not answer by then hears of a
# change from the database's notification, api.tenant_events, as a replica does, and writes its usage within
# ENGRAM_USAGE_FLUSH_SECONDS).
ASK_SECONDS = 2.0
# How long a stopping process waits to tell its router of the last connections it took (else it leaves them).
ACKNOWLEDGE_SECONDS = 2.0
# Keys whose tenant the router remembers (then it forgets them all and learns again).
MAX_KNOWN_KEYS = 200_000
# How long a connection counts towards its tenant's share of the connections routed (the half-life of its weight).
SHARE_HALF_LIFE_SECONDS = 60.0


def authorization(head: bytes) -> bytes | None:
    """The value of the ``Authorization`` header in a request head, once its line is complete, else None."""
    start = 0
    while (end := head.find(b"\r\n", start)) != -1:
        line = head[start:end]
        if start and not line:  # the blank line: the head ended without one
            return None
        name, colon, value = line.partition(b":")
        if start and colon and name.strip().lower() == b"authorization":
            return value.strip()
        start = end + 2
    return None


def head_complete(head: bytes) -> bool:
    return b"\r\n\r\n" in head or len(head) >= PEEK_BYTES


def bearer(credential: bytes) -> bytes | None:
    """The API key of an ``Authorization`` value (``Bearer <key>``, as api.auth reads it), else None."""
    scheme, _, token = credential.partition(b" ")
    token = token.strip()
    return token if scheme.lower() == b"bearer" and token else None


def key_digest(token: bytes) -> int:
    return zlib.crc32(token)


def owner(token: bytes, processes: int, tenants: dict[int, int] | None = None) -> int:
    """The first process that serves requests with the API key ``token``: its tenant's, when ``tenants`` (key
    digest -> tenant id) knows it, else the one the key's hash names."""
    digest = key_digest(token)
    tenant = tenants.get(digest) if tenants else None
    return (tenant if tenant is not None else digest) % processes


def tenant_processes(tenant_id: int, processes: int, per_tenant: int) -> list[int]:
    """The processes that serve a tenant: the one its id names and the next ones, ``per_tenant`` in all (at most
    every process)."""
    return [(tenant_id + step) % processes for step in range(min(per_tenant, processes))]


class Shares:
    """Each tenant's share of the connections routed lately, each connection's weight halving every
    ``half_life`` seconds (updated in O(1) a connection, whatever the number of tenants), and how many of its
    connections were routed (which of its processes is next)."""

    def __init__(self, half_life: float = SHARE_HALF_LIFE_SECONDS) -> None:
        self._rate = math.log(2) / half_life
        self._weights: dict[int, tuple[float, float, int]] = {}  # tenant id -> (weight, when, connections)
        self._total = (0.0, 0.0)

    def _decayed(self, weight: float, when: float, now: float) -> float:
        return weight * math.exp(-self._rate * (now - when)) if now > when else weight

    def add(self, tenant_id: int, now: float) -> tuple[float, int]:
        """Count a connection of the tenant; returns the tenant's share of the recent connections, this one in,
        and how many of its connections came before it."""
        if len(self._weights) >= MAX_KNOWN_KEYS:  # (then every share starts again)
            self._weights.clear()
            self._total = (0.0, now)
        weight, when, before = self._weights.get(tenant_id, (0.0, now, 0))
        weight = self._decayed(weight, when, now) + 1.0
        total = self._decayed(*self._total, now) + 1.0
        self._weights[tenant_id] = (weight, now, before + 1)
        self._total = (total, now)
        return weight / total, before


def processes_for_share(share: float, processes: int, most: int) -> int:
    """How many processes serve a tenant with ``share`` of the recent connections: one per 1/N of them, rounded
    down past a quarter (a tenant at 1.75/N of them gets two), at least one, at most ``most``."""
    return max(1, min(most, processes, int(share * processes + 0.25)))


@dataclass
class _Process:
    index: int
    argv: Sequence[str]
    popen: subprocess.Popen[bytes] | None = None
    channel: socket.socket | None = None  # the router's end of the pair; the process has the other
    restarts: list[float] = field(default_factory=list)
    start_at: float = 0.0  # when a dead process is started again
    # Connections passed to it that it has not acknowledged yet, oldest first: the router's copies.
    pending: deque[socket.socket] = field(default_factory=deque)
    ended: bool = False  # its end of the socket pair closed: it is exiting (or exited)

    @property
    def live(self) -> bool:
        return self.popen is not None and not self.ended and self.popen.poll() is None and self.channel is not None


@dataclass
class _Waiting:
    connection: socket.socket
    deadline: float


@dataclass
class _Asked:
    """A process's request to the others, until each has said it did it."""

    origin: int  # the asking process
    number: int  # the asking process's number for it
    tenant: int
    unanswered: set[int] = field(default_factory=set)  # the processes that have not said so yet


class Router:
    """The listening process: routes each new connection to its key's process, keeps the processes running."""

    def __init__(
        self,
        listener: socket.socket,
        argv: Sequence[str],
        processes: int,
        per_tenant: int = 1,
        env: dict[str, str] | None = None,
    ) -> None:
        self.listener = listener
        self.env = env or {}  # set for the processes besides this process's own environment
        self.processes = [_Process(index, [*argv, "--handoff-fd"]) for index in range(processes)]
        self.per_tenant = per_tenant  # the most processes one tenant is served by
        self.shares = Shares()
        self.clock = time.monotonic
        self.selector = selectors.DefaultSelector()
        self.waiting: dict[int, _Waiting] = {}  # by fd: connections not routed yet
        self.rechecking: set[int] = set()  # those of them whose head came in part (no longer selected)
        self.unsent: list[tuple[socket.socket, int]] = []  # no process could take them yet
        self.tenants: dict[int, int] = {}  # key digest -> tenant id, as the processes report them
        self.asked: dict[int, _Asked] = {}  # the processes' requests to each other, by the router's number
        self.next_asked = 0
        self.next_index = 0
        self.stopping = False
        self.code = 0

    # The processes.
    def _start(self, process: _Process) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)
        try:
            process.popen = subprocess.Popen(
                [*process.argv, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                preexec_fn=die_with_parent(signal.SIGKILL),
                env={
                    **os.environ,
                    **self.env,
                    "ENGRAM_API_PROCESS": str(process.index),  # which one it is (logs, tests)
                    # How many share the host: each runs its share of the requests (core.config: api_inflight).
                    "ENGRAM_API_WORKERS": str(len(self.processes)),
                },
            )
        finally:
            theirs.close()
        process.channel = ours
        process.ended = False
        self.selector.register(ours, selectors.EVENT_READ, process)

    def _hear(self, process: _Process) -> None:
        """Take what a process reported: the tenants of keys it authenticated, the connections it took."""
        if process.channel is None or process.ended:
            return
        while True:
            try:
                message = process.channel.recv(_LEARNED.size)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # (a reset: its end closed with messages unread)
                message = b""
            if not message:  # it exited (_tend starts it again)
                self._end(process)
                return
            if len(message) == _LEARNED.size:
                kind, number, tenant = _LEARNED.unpack(message)
                if kind == b"t":
                    if len(self.tenants) >= MAX_KNOWN_KEYS:
                        self.tenants.clear()
                    self.tenants[number] = tenant
                elif kind == b"a":
                    for _ in range(min(number, len(process.pending))):
                        process.pending.popleft().close()
                elif kind in _REQUESTS:
                    self._ask(process, kind, number, tenant)
                elif kind == b"k":
                    self._answered(process.index, number)

    def _ask(self, origin: _Process, kind: bytes, number: int, tenant: int) -> None:
        """Pass a process's request to every other live process; the asking process is told once each has done it
        (or has died)."""
        self.next_asked = (self.next_asked + 1) % 2**32
        asked = _Asked(origin.index, number, tenant)
        message = _LEARNED.pack(kind, self.next_asked, tenant)
        for process in self.processes:
            if process is origin or not process.live:
                continue
            assert process.channel is not None
            try:
                process.channel.send(message)
            except OSError:  # its queue is full (it takes nothing) or it died: not waited for
                continue
            asked.unanswered.add(process.index)
        self.asked[self.next_asked] = asked
        self._answered(None, self.next_asked)

    def _answered(self, index: int | None, number: int) -> None:
        """Process ``index`` did what request ``number`` asked; the asking process is told when none is left."""
        asked = self.asked.get(number)
        if asked is None:
            return
        if index is not None:
            asked.unanswered.discard(index)
        if asked.unanswered:
            return
        del self.asked[number]
        origin = self.processes[asked.origin]
        if origin.live:
            assert origin.channel is not None
            with contextlib.suppress(OSError):  # (it waits ASK_SECONDS at most)
                origin.channel.send(_LEARNED.pack(b"d", asked.number, asked.tenant))

    def _end(self, process: _Process) -> None:
        """A process's end of the pair closed: it takes nothing more, and the connections it had not taken go
        to the next live process (or wait, unsent)."""
        if process.ended:
            return
        process.ended = True
        if process.channel is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(process.channel)
        pending, process.pending = process.pending, deque()
        for connection in pending:
            self._send(connection, process.index)
        for number in list(self.asked):  # nothing more to wait for from it
            self._answered(process.index, number)

    def _tend(self) -> None:
        """Start again a process that died on its own, as api.serve.supervise does (restart_delay)."""
        now = time.monotonic()
        for process in self.processes:
            if process.popen is None or process.popen.poll() is None:
                continue
            if process.channel is not None:
                self._hear(process)  # its last reports (an exited process's pair is at EOF: _end)
                self._end(process)
                process.channel.close()
                process.channel = None
                code = process.popen.returncode
                delay = restart_delay(process.restarts, now)
                if delay is None:
                    click.echo(f"api process {process.index} exited with {code} too often; giving up", err=True)
                    self.code = code or 1
                    self.stop()
                    return
                click.echo(f"api process {process.index} exited with {code}; restarting in {delay:.0f} s", err=True)
                process.start_at = now + delay
            if not self.stopping and now >= process.start_at:
                self._start(process)

    # The connections.
    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # e.g. out of file descriptors: the rest stay in the backlog for the next round
                return
            connection.setblocking(False)
            self.waiting[connection.fileno()] = _Waiting(connection, time.monotonic() + PEEK_SECONDS)
            self.selector.register(connection, selectors.EVENT_READ, None)

    def _look(self, waiting: _Waiting, *, now: float) -> bool:
        """Route the connection if its head says enough (or its time is up); False to look again later."""
        connection = waiting.connection
        try:
            head = connection.recv(PEEK_BYTES, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            head = None
        except OSError:
            head = b""
        if head == b"":  # closed (or reset) before a request: nothing to serve
            connection.close()
            return True
        credential = authorization(head) if head else None
        if credential is None and head is not None and not head_complete(head) and now < waiting.deadline:
            return False
        token = bearer(credential) if credential else None
        self._send(connection, self._route(token) if token else self._turn())
        return True

    def _route(self, token: bytes) -> int:
        """The process for a new connection of the key ``token``: once the key's tenant is known, its processes in
        turn, as many as its share of the recent connections calls for; until then the process the key's hash
        names."""
        tenant = self.tenants.get(key_digest(token))
        if tenant is None:
            return owner(token, len(self.processes))
        count = len(self.processes)
        share, turn = self.shares.add(tenant, self.clock())
        serving = tenant_processes(tenant, count, processes_for_share(share, count, self.per_tenant))
        return serving[turn % len(serving)]

    def _turn(self) -> int:
        self.next_index = (self.next_index + 1) % len(self.processes)
        return self.next_index

    def _send(self, connection: socket.socket, index: int) -> None:
        """Pass the connection to process ``index``, or the next live one; it is ours to close after."""
        count = len(self.processes)
        for step in range(count):
            process = self.processes[(index + step) % count]
            if not process.live:
                continue
            assert process.channel is not None
            try:
                socket.send_fds(process.channel, [b"c"], [connection.fileno()])
            except (BlockingIOError, InterruptedError):  # its queue is full: it is not taking any
                continue
            except OSError:  # it died just now; _tend starts it again
                continue
            process.pending.append(connection)  # closed once it says it took it
            return
        self.unsent.append((connection, index))

    def _resend(self) -> None:
        unsent, self.unsent = self.unsent, []
        for connection, index in unsent:
            self._send(connection, index)

    def _waited(self, now: float) -> None:
        """Look again at heads that were not complete, and route connections whose time to speak is up."""
        for fd in list(self.rechecking):
            if self._look(self.waiting[fd], now=now):
                self.rechecking.discard(fd)
                del self.waiting[fd]
        for fd, waiting in list(self.waiting.items()):
            if fd not in self.rechecking and now >= waiting.deadline:  # connected, said nothing yet
                self.selector.unregister(waiting.connection)
                del self.waiting[fd]
                self._send(waiting.connection, self._turn())

    def _timeout(self, now: float) -> float:
        if self.rechecking or self.unsent:
            return _REPEEK_SECONDS
        deadlines = [waiting.deadline for waiting in self.waiting.values()]
        return max(0.0, min([0.5, *(deadline - now for deadline in deadlines)]))

    def stop(self, signum: int | None = None, frame: FrameType | None = None) -> None:
        self.stopping = True

    def run(self) -> int:
        for process in self.processes:
            self._start(process)
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        try:
            while not self.stopping:
                self._tend()
                for key, _ in self.selector.select(self._timeout(time.monotonic())):
                    if key.fileobj is self.listener:
                        self._accept()
                        continue
                    if key.data is not None:  # a process's end of its socket pair
                        self._hear(key.data)
                        continue
                    # A head not complete yet is looked at again shortly (_waited), not at every event of
                    # its socket, which stays readable while its bytes are unread.
                    self.selector.unregister(key.fileobj)
                    if self._look(self.waiting[key.fd], now=time.monotonic()):
                        del self.waiting[key.fd]
                    else:
                        self.rechecking.add(key.fd)
                self._waited(time.monotonic())
                self._resend()
            self._drain()
        finally:
            self.selector.close()
        return self.code

    def _drain(self) -> None:
        """Stop: take what the kernel already accepted, hand every connection on, then stop the processes
        (each drains its own connections, api.serve.graceful) and wait for them."""
        with contextlib.suppress(OSError):
            self.selector.unregister(self.listener)
        self._accept()
        self.listener.close()
        for fd, waiting in list(self.waiting.items()):
            if fd not in self.rechecking:
                self.selector.unregister(waiting.connection)
            self._look(waiting, now=waiting.deadline)  # routed now, whatever its head says
            del self.waiting[fd]
        self.rechecking.clear()
        self._resend()
        for process in self.processes:
            if process.popen is not None and process.popen.poll() is None:
                process.popen.send_signal(signal.SIGTERM)
        # Each takes what was passed to it before it stops; its reports are read meanwhile, so that a connection
        # it took is closed here at once (its client sees the end of a connection the process closed).
        while any(process.popen is not None and process.popen.poll() is None for process in self.processes):
            for key, _ in self.selector.select(0.05):
                if key.data is not None:
                    self._hear(key.data)
        for process in self.processes:
            self._hear(process)  # its last reports
            while process.pending:  # (passed on, when it did not take them, to none that is running)
                process.pending.popleft().close()
            if process.channel is not None:
                process.channel.close()
        for connection, _ in self.unsent:  # no process to serve them
            connection.close()
        self.unsent = []


def run_routed(
    argv: Sequence[str], *, host: str, port: int, processes: int, per_tenant: int = 1, backlog: int = 2048
) -> int:
    """Listen on ``host:port`` and run ``processes`` API processes (each ``argv`` + ``--handoff-fd FD``), each
    tenant served by at most ``per_tenant`` of them."""
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as error:
        click.echo(f"cannot listen on {host}:{port}: {error}", err=True)
        return 3  # uvicorn's STARTUP_FAILURE
    listener.listen(backlog)
    with shared_metrics() as metrics:
        router = Router(listener, argv, processes, per_tenant, env=metrics)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, router.stop)
        return router.run()


@contextlib.contextmanager
def shared_metrics() -> Iterator[dict[str, str]]:
    """The environment that puts the processes' own metrics (requests, search latency) in prometheus_client's
    multiprocess mode, in a directory of this router's removed when it stops: GET /metrics, answered by whichever
    process the connection reached, then counts the requests of all of them (each process counting only its own,
    a scraper would see counters jump back and forth). An operator's own PROMETHEUS_MULTIPROC_DIR is kept."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        yield {}
        return
    directory = tempfile.mkdtemp(prefix="engram-metrics-")
    try:
        yield {"PROMETHEUS_MULTIPROC_DIR": directory}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


_router: socket.socket | None = None  # in a routed API process: its end of the socket pair
_handlers: dict[bytes, Callable[[int], object]] = {}  # what this process does when another asks (api.app)
_answers: dict[int, threading.Event] = {}  # this process's requests to the others, by number, set when done
_numbers = itertools.count(1)


def on_asked(kind: bytes, handler: Callable[[int], object]) -> None:
    """What this process runs (on a thread, with the tenant id) when another routed process asks ``kind``."""
    if kind not in _REQUESTS:
        raise ValueError(f"unknown request {kind!r}")
    _handlers[kind] = handler


def ask_the_others(kind: bytes, tenant_id: int = 0) -> bool:
    """Have every other API process of this router do ``kind`` (FORGET: drop the tenant's cached callers, so a key
    revoked or a tenant suspended through this process is refused by all of them from the next request on, not
    only once the database's notification reaches them; FLUSH_USAGE: write the usage they counted), and wait
    until each has, at most ASK_SECONDS. True when each did, or when this process is not routed. Blocks: a
    request thread's call, never the event loop's."""
    router = _router
    if router is None:
        return True
    number = next(_numbers) % 2**32
    done = threading.Event()
    _answers[number] = done
    try:
        router.send(_LEARNED.pack(kind, number, tenant_id))
        return done.wait(ASK_SECONDS)
    except OSError:  # the router's queue is full or it is gone
        return False
    finally:
        _answers.pop(number, None)


def learned(token: str, tenant_id: int) -> None:
    """Tell this process's router (if it has one) the tenant of an API key it just authenticated."""
    if _router is None:
        return
    with contextlib.suppress(OSError):  # a hint: if the router cannot take it now, the key is routed by hash
        _router.send(_LEARNED.pack(b"t", key_digest(token.encode()), tenant_id))


class HandoffServer(DrainingServer):
    """An API process that serves the connections its router passes it instead of listening itself."""

    def __init__(self, config: uvicorn.Config, *, drain_seconds: float, handoff: socket.socket) -> None:
        super().__init__(config, drain_seconds=drain_seconds)
        self.handoff = handoff
        self._connecting: set[asyncio.Future[Any]] = set()
        self._unacknowledged = 0  # connections taken that the router has not been told of yet
        self._taken: list[int] = []  # their descriptors (served once it has)
        self._retrying = False

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        global _router
        await super().startup(sockets=[])  # no listening socket of its own
        if self.started:
            self.handoff.setblocking(False)
            _router = self.handoff
            asyncio.get_running_loop().add_reader(self.handoff.fileno(), self._take)

    def _take(self) -> None:
        """Take the connections the router passed, tell it so, then serve them."""
        while True:
            try:
                data, fds, _flags, _address = socket.recv_fds(self.handoff, 64, 64)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                data, fds = b"", []
            if not data and not fds:  # the router is gone: stop as on SIGTERM
                asyncio.get_running_loop().remove_reader(self.handoff.fileno())
                self.should_exit = True
                break
            if len(data) == _LEARNED.size:  # not a connection: a request of another process, or its answer
                self._heard(data)
                continue
            # One connection a message, counted even when its descriptor did not come (this process is out of
            # them: the kernel drops it), so that the router's count of what it holds stays in step.
            self._unacknowledged += 1
            self._taken.extend(fds)
        self._acknowledge()

    def _acknowledge(self) -> None:
        """Tell the router how many connections were taken, then serve them: only a connection the router knows
        taken is served here (one it does not, it passes to another process if this one ends)."""
        if self._unacknowledged:
            if self.handoff.fileno() == -1:  # (a retry after the last acknowledgement)
                return
            try:
                self.handoff.send(_LEARNED.pack(b"a", self._unacknowledged, 0))
            except (BlockingIOError, InterruptedError):  # its queue is full: again shortly, serving nothing yet
                if not self._retrying:
                    self._retrying = True
                    asyncio.get_running_loop().call_later(0.001, self._retry)
                return
            except TimeoutError:  # (the last, blocking, send) the router holds them still: they are its to pass on
                for fd in self._taken:
                    os.close(fd)
                self._taken = []
                self._unacknowledged = 0
                return
            except OSError:  # the router is gone: nobody else will serve them
                pass
            self._unacknowledged = 0
        taken, self._taken = self._taken, []
        loop = asyncio.get_running_loop()
        for fd in taken:
            connection = socket.socket(fileno=fd)
            connection.setblocking(False)
            future = asyncio.ensure_future(loop.connect_accepted_socket(self._new_protocol, connection))
            self._connecting.add(future)
            future.add_done_callback(self._connecting.discard)

    def _retry(self) -> None:
        self._retrying = False
        self._acknowledge()

    def _heard(self, message: bytes) -> None:
        kind, number, tenant = _LEARNED.unpack(message)
        if kind == b"d":  # every other process did what this one asked: the request thread waiting goes on
            done = _answers.get(number)
            if done is not None:
                done.set()
        elif kind in _REQUESTS:  # another process asks: done on a thread (it may write to the database), then said
            handler = _handlers.get(kind)
            answer = _LEARNED.pack(b"k", number, tenant)
            if handler is None:
                self._say(answer)
                return
            done_there = asyncio.get_running_loop().run_in_executor(None, handler, tenant)
            done_there.add_done_callback(lambda finished: self._answer(finished, answer))

    def _answer(self, finished: asyncio.Future[object], answer: bytes) -> None:
        if not finished.cancelled() and finished.exception() is not None:
            log.warning("a request of another API process failed here: %s", finished.exception())
        self._say(answer)

    def _say(self, message: bytes) -> None:
        try:
            self.handoff.send(message)
        except (BlockingIOError, InterruptedError):  # its queue is full: again shortly
            asyncio.get_running_loop().call_later(0.001, self._say, message)
        except OSError:  # the router is gone
            pass

    async def _accept_backlog(self) -> None:
        """Serve what the router passed before it asked this process to stop, then take no more."""
        global _router
        _router = None
        with contextlib.suppress(ValueError, OSError):
            asyncio.get_running_loop().remove_reader(self.handoff.fileno())
        self._take()
        if self._unacknowledged:  # the router reads its processes' reports while it waits for them to stop
            self.handoff.settimeout(ACKNOWLEDGE_SECONDS)
            self._acknowledge()
        if self._connecting:
            await asyncio.gather(*self._connecting, return_exceptions=True)
        self.handoff.close()


def run_handoff(app: str, *, handoff_fd: int, drain_seconds: float, **options: Any) -> None:
    """One routed API process: ``app`` served on the connections passed over ``handoff_fd``."""
    config = uvicorn.Config(app, **options)
    handoff = socket.socket(fileno=handoff_fd)
    server = HandoffServer(config, drain_seconds=drain_seconds, handoff=handoff)
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[])
    if not server.started:
        raise SystemExit(3)
