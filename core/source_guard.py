"""Which datasources this server may open.

Engram's own database (and broker) is never a datasource, however its URL is spelled. In hosted mode
(``ENGRAM_DATASOURCE_POLICY=hosted``, the default of `engram api` and `engram worker`) a source's host
must also resolve to public addresses only, unless an operator lists it in
``ENGRAM_DATASOURCE_ALLOW_HOSTS``; SQLite files must lie under ``ENGRAM_SQLITE_ROOTS``. Local mode (what
`engram serve` sets) allows loopback and private sources.

The checks judge the addresses a host resolves to at the moment of connecting, and :func:`pin_target`
then makes the driver connect to exactly the address checked (libpq's ``hostaddr``, the IP for
PyMySQL), so a DNS answer that changes between check and connect (rebinding) cannot move the target.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import psutil
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from core.config import get_settings
from core.errors import Invalid
from core.runtime import ServiceNotRunning, read_runtime, resolve_database_url, resolve_redis_url

HOSTED, LOCAL = "hosted", "local"
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], list[IPAddress]]

DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306, "mariadb": 3306, "redis": 6379, "rediss": 6379}
# Connection parameters that name another target or make the driver read server files: the target
# could then be one the checks never saw (a pg_service entry, a my.cnf with its own host).
_ALWAYS_REFUSED_PARAMS = {
    "postgresql": {"hostaddr", "service", "servicefile", "passfile"},
    "mysql": {"read_default_file", "read_default_group", "local_infile", "bind_address"},
}
# Files on the server a hosted tenant must not point the driver at.
_HOSTED_REFUSED_PARAMS = {
    "postgresql": {"sslkey", "sslcert", "sslrootcert", "sslcrl", "sslcrldir"},
    "mysql": {"ssl_ca", "ssl_cert", "ssl_key", "ssl_capath", "unix_socket"},
}
# Addresses of cloud instance-metadata and host agents; the rest of the refused ranges come from ipaddress.
_METADATA = {
    ipaddress.ip_address(a) for a in ("169.254.169.254", "169.254.170.2", "168.63.129.16", "100.100.100.200")
} | {ipaddress.ip_address("fd00:ec2::254")}
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
SHARED_ROOT = Path("/var/lib/engram")  # where root's embedded clusters live (api.serve.embedded)

# The one answer a tenant gets for any failure to connect (refused, timeout, TLS, credentials, DNS).
UNREACHABLE = "cannot reach the source (check the datasource URL's host, port, database and credentials)"


class SourceRefused(Invalid):
    """A datasource this server will not open, whatever it holds; retrying cannot change that."""

    def __init__(self, message: str) -> None:
        super().__init__(message, field="url")


class SourceUnreachable(Exception):
    """The source did not answer; its message is the one generic text a tenant ever sees."""

    def __init__(self) -> None:
        super().__init__(UNREACHABLE)


def policy() -> str:
    """hosted or local: the setting, else the mode of a running `engram serve` on this home, else hosted."""
    configured = get_settings().datasource_policy
    if configured:
        return configured

    record = read_runtime()
    return LOCAL if record and record.get("datasource_policy") == LOCAL else HOSTED


def describe_policy() -> str:
    """One line saying what datasources this process accepts (printed by `engram serve` at start)."""
    settings = get_settings()
    allow = ", ".join(settings.datasource_allow_hosts)
    roots = ", ".join(str(r) for r in settings.sqlite_roots)
    if policy() == LOCAL:
        sqlite = f"SQLite under {roots}" if roots else f"any SQLite file outside {settings.home}, /proc, /sys, /dev"
        return f"datasources (local mode): loopback and private hosts and {sqlite}; never engram's own database"
    hosts = f"public hosts plus {allow}" if allow else "public hosts only"
    sqlite = f"SQLite under {roots}" if roots else "no SQLite"
    return f"datasources (hosted mode): {hosts}, {sqlite}; never engram's own database"


def resolve_host(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` resolves to (numeric spellings such as 127.1 or 0x7f000001 included)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError, ValueError):
        raise SourceUnreachable() from None
    found = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if address not in found:
            found.append(address)
    if not found:
        raise SourceUnreachable()
    return found


def _unwrap(address: IPAddress) -> IPAddress:
    """The IPv4 address inside an IPv4-mapped, 6to4, Teredo or NAT64 IPv6 address (where it leads)."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.sixtofour is not None:
            return address.sixtofour
        if address.teredo is not None:
            return address.teredo[1]
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def refused_kind(address: IPAddress) -> str | None:
    """Why hosted mode refuses ``address`` (loopback, private, ...), or None for a public address."""
    address = _unwrap(address)
    checks = (
        ("metadata", address in _METADATA),
        ("loopback", address.is_loopback),
        ("unspecified", address.is_unspecified),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("CGNAT", isinstance(address, ipaddress.IPv4Address) and address in _CGNAT),
        ("private", address.is_private),
        ("reserved", address.is_reserved or not address.is_global),
    )
    return next((kind for kind, hit in checks if hit), None)


def this_machine(address: IPAddress) -> bool:
    """Whether connecting to ``address`` reaches this machine (0.0.0.0 does, on Linux)."""
    address = _unwrap(address)
    if address.is_loopback or address.is_unspecified:
        return True
    try:
        interfaces = psutil.net_if_addrs()
    except OSError:
        return False
    for addresses in interfaces.values():
        for entry in addresses:
            try:
                if _unwrap(ipaddress.ip_address(entry.address.split("%")[0])) == address:
                    return True
            except ValueError:
                continue  # a MAC address
    return False


@dataclass
class Target:
    """Where a URL connects: a TCP host and port, or a local socket (directory or file) and port."""

    dialect: str
    port: int
    host: str | None = None  # TCP host as written (percent-decoded)
    socket_path: str | None = None  # PostgreSQL socket directory, MySQL socket file, "" for the default
    database: str | None = None
    addresses: list[IPAddress] = field(default_factory=list)


def _values(value: Any) -> list[str]:
    items = [value] if isinstance(value, str) else list(value or ())
    # libpq takes comma-separated lists in host and port (one entry per host to try).
    return [part for item in items for part in str(item).split(",")]


def parse_target(url: URL) -> Target:
    """The one endpoint a network URL names; 422 for several hosts or parameters that redirect it."""
    dialect = "mysql" if url.get_backend_name() == "mariadb" else url.get_backend_name()
    query = {key.lower(): value for key, value in url.query.items()}
    for name in sorted(_ALWAYS_REFUSED_PARAMS.get(dialect, set()) & set(query)):
        raise SourceRefused(f"the URL parameter {name!r} is not accepted in a datasource URL")
    if policy() == HOSTED:
        # sslrootcert=system names the machine's trust store, not a file the tenant chose.
        files = {k for k in _HOSTED_REFUSED_PARAMS.get(dialect, set()) & set(query) if query[k] != "system"}
        for name in sorted(files):
            raise SourceRefused(f"the URL parameter {name!r} is not accepted by this server")
    hosts = _values(url.host) + _values(query.get("host"))
    ports = ([str(url.port)] if url.port is not None else []) + _values(query.get("port"))
    hosts = [unquote(h).strip() for h in hosts if h.strip()]
    if len(set(hosts)) > 1 or len(set(ports)) > 1:
        raise SourceRefused("a datasource URL names one host and one port")
    try:
        port = int(ports[0]) if ports else DEFAULT_PORTS.get(dialect, 0)
    except ValueError:
        raise SourceRefused("the datasource URL's port is not a number") from None
    if not 0 < port < 65536:
        raise SourceRefused("the datasource URL's port is out of range")
    target = Target(dialect=dialect, port=port, database=_database_of(url, query))
    socket_file = query.get("unix_socket")
    host = hosts[0] if hosts else None
    if dialect == "mysql" and socket_file:
        target.socket_path = unquote(str(socket_file))
    elif host is not None and (host.startswith("/") or host.startswith("@")):
        target.socket_path = host  # a libpq socket directory, or an abstract socket name
    elif host is None and dialect == "postgresql":
        target.socket_path = ""  # libpq's default socket directory
    else:
        target.host = (host or "localhost").strip("[]")
    return target


def _database_of(url: URL, query: dict[str, Any]) -> str | None:
    name = query.get("dbname") or query.get("database") or url.database or url.username
    return unquote(str(name)) if name else None


@dataclass(frozen=True)
class _Own:
    port: int
    addresses: tuple[IPAddress, ...]
    sockets: tuple[str, ...]
    local: bool
    database: str | None


def _own_endpoints(resolve: Resolver) -> list[_Own]:
    """Engram's database and broker as this process reaches them (settings, else `engram serve`'s record)."""

    def app_database_url() -> str:  # the service's own role may reach the database another way (a pooler)
        return get_settings().app_database_url or resolve_database_url()

    owns = []
    for find in (resolve_database_url, app_database_url, resolve_redis_url):
        try:
            url = make_url(find())
        except (ServiceNotRunning, ArgumentError, ValueError):
            continue
        query = {key.lower(): value for key, value in url.query.items()}
        backend = url.get_backend_name()
        hosts = [unquote(h) for h in ([url.host] if url.host else []) + _values(query.get("host"))]
        ports = [int(p) for p in ([str(url.port)] if url.port else []) + _values(query.get("port")) if p.isdigit()]
        sockets = tuple(h for h in hosts if h.startswith("/")) + ((url.database or "",) if backend == "unix" else ())
        addresses: list[IPAddress] = []
        for host in (h for h in hosts if not h.startswith("/")):
            try:
                addresses += resolve(host.strip("[]"), ports[0] if ports else 0)
            except SourceUnreachable:
                continue
        local = not hosts or bool(sockets) or any(this_machine(a) for a in addresses)
        for port in ports or [DEFAULT_PORTS.get(backend, 0)]:
            database = _database_of(url, query) if backend == "postgresql" else None
            owns.append(_Own(port, tuple(addresses), sockets, local, database))
    return owns


def _under(path: str, roots: Iterable[Path]) -> bool:
    try:
        resolved = Path(path).resolve()
    except (OSError, RuntimeError, ValueError):
        return True  # a path that cannot be judged is refused
    return any(resolved == root or root in resolved.parents for root in roots)


def _engram_dirs() -> list[Path]:
    return [get_settings().home.expanduser().resolve(), SHARED_ROOT]


def check_target(target: Target, *, resolve: Resolver = resolve_host) -> Target:
    """Refuse engram's own services always, and in hosted mode every non-public address not allowed by
    the operator; fills ``target.addresses`` with what the host resolves to now."""
    hosted = policy() == HOSTED
    allow = [entry.strip() for entry in get_settings().datasource_allow_hosts if entry.strip()]
    if target.host is not None:
        target.addresses = resolve(target.host, target.port)
    own = _own_endpoints(resolve)
    if _is_own(target, own):
        raise SourceRefused("this URL names engram's own database, which is never a datasource")
    if not hosted:
        return target
    if target.socket_path is not None:
        if target.socket_path in allow:
            return target
        raise SourceRefused(
            "local sockets are not accepted by this server (an operator can allow one in ENGRAM_DATASOURCE_ALLOW_HOSTS)"
        )
    assert target.host is not None
    if _host_allowed(target.host, allow):
        return target
    networks = _allowed_networks(allow)
    for address in target.addresses:
        if refused_kind(address) and not any(_unwrap(address) in n or address in n for n in networks):
            raise SourceRefused(
                f"datasource host {target.host[:200]!r} is not allowed on this server: loopback, private, "
                "link-local and metadata addresses are refused (an operator can allow hosts in "
                "ENGRAM_DATASOURCE_ALLOW_HOSTS)"
            )
    return target


def _is_own(target: Target, owns: list[_Own]) -> bool:
    if target.socket_path is not None:
        path = target.socket_path
        if path and (path.startswith("/") and _under(path, _engram_dirs())):
            return True
        dirs = {Path(p).resolve() for own in owns for p in own.sockets}
        if path.startswith("/") and (Path(path).resolve() in dirs or Path(path).resolve().parent in dirs):
            return True
        # A socket's file name carries the port (.s.PGSQL.<port>), so any directory may hold ours.
        named = Path(path).name if path.startswith("/") else ""
        return any(own.local and (target.port == own.port or named == f".s.PGSQL.{own.port}") for own in owns)
    for own in owns:
        machine = own.local and any(this_machine(a) for a in target.addresses)
        if own.port == target.port and (machine or set(target.addresses) & set(own.addresses)):
            return True
        if machine and target.dialect == "postgresql" and own.database and target.database == own.database:
            return True
    return False


def _host_allowed(host: str, allow: list[str]) -> bool:
    name = host.lower().rstrip(".")
    for entry in (e.lower().rstrip(".") for e in allow if not e.startswith("/")):
        if entry == name or (entry.startswith("*.") and name.endswith(entry[1:])):
            return True
    return False


def _allowed_networks(allow: list[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    networks = []
    for entry in allow:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            continue  # a host name or a socket directory
    return networks


def pin_target(url: URL, target: Target) -> tuple[URL, dict[str, Any]]:
    """The URL and driver arguments that connect to exactly the checked endpoint."""
    query = {k: v for k, v in url.query.items() if k.lower() not in ("host", "port", "hostaddr")}
    if target.dialect == "postgresql":
        if target.socket_path is not None:
            host_query = {"host": target.socket_path} if target.socket_path else {}
            return url.set(host=None, port=target.port, query={**query, **host_query}), {}
        assert target.host is not None
        pinned = url.set(host=target.host, port=target.port, query=query)
        return pinned, {"hostaddr": str(target.addresses[0])}
    if target.socket_path is not None:
        return url.set(query=query), {}
    return url.set(host=str(target.addresses[0]), port=target.port, query=query), {}


def check_sqlite_path(database: str) -> Path:
    """The resolved path of a SQLite datasource, if this server may read it (422 otherwise)."""
    settings = get_settings()
    path = Path(database).expanduser().resolve()
    forbidden = [Path("/proc"), Path("/sys"), Path("/dev")]
    if _under(str(path), forbidden):
        raise SourceRefused(f"a SQLite datasource cannot be under {', '.join(map(str, forbidden))}")
    if _under(str(path), _engram_dirs()):
        raise SourceRefused("a SQLite datasource cannot be one of engram's own files")
    roots = [root.expanduser().resolve() for root in settings.sqlite_roots]
    if not roots and policy() == HOSTED:
        raise SourceRefused(
            "SQLite datasources are disabled on this server (an operator enables them with ENGRAM_SQLITE_ROOTS)"
        )
    if roots and not any(root in path.parents for root in roots):
        raise SourceRefused(f"SQLite datasources must be under {', '.join(map(str, roots))} (ENGRAM_SQLITE_ROOTS)")
    return path


def serve_policy() -> str:
    """The mode `engram serve` runs its children in: local (one machine, its own sources), unless the
    operator chose one with ENGRAM_DATASOURCE_POLICY."""
    return get_settings().datasource_policy or LOCAL
