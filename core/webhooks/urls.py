"""Which webhook URLs this server may post to: the datasource host checks (core.source_guard).

Hosted mode refuses hosts that resolve to loopback, private, link-local or metadata addresses (unless an
operator allows them in ENGRAM_DATASOURCE_ALLOW_HOSTS); local mode (`engram serve`) allows them. A URL is
checked when it is registered and its host resolved and checked again before every delivery attempt, so a
DNS answer changed since registration cannot point a delivery at a refused address.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit, urlunsplit

from core.config import get_settings
from core.errors import Invalid
from core.source_guard import (
    HOSTED,
    IPAddress,
    SourceUnreachable,
    _allowed_networks,
    _host_allowed,
    _unwrap,
    policy,
    refused_kind,
    resolve_host,
)

MAX_URL_CHARS = 2_000


class WebhookUrlRefused(Invalid):
    def __init__(self, message: str) -> None:
        super().__init__(message, field="url")


def parse_webhook_url(url: object) -> tuple[str, int]:
    """The host and port of an http(s) URL; 422 for anything else."""
    if not isinstance(url, str) or not url.strip():
        raise WebhookUrlRefused("url must be an http:// or https:// URL")
    if len(url) > MAX_URL_CHARS:
        raise WebhookUrlRefused(f"url is longer than {MAX_URL_CHARS} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise WebhookUrlRefused("url is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WebhookUrlRefused("url must be an http:// or https:// URL with a host")
    if parts.username or parts.password:
        raise WebhookUrlRefused("url must not carry credentials (the signature authenticates deliveries)")
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


def check_webhook_url(url: object) -> str:
    """Refuse a URL this server may not post to now (resolving its host); returns the URL."""
    checked_addresses(url)
    assert isinstance(url, str)
    return url


def checked_addresses(url: object) -> list[IPAddress]:
    """What the URL's host resolves to now, every address allowed (else WebhookUrlRefused)."""
    host, port = parse_webhook_url(url)
    try:
        addresses = resolve_host(host, port)
    except SourceUnreachable:
        raise WebhookUrlRefused(f"the webhook host {host[:200]!r} does not resolve") from None
    if policy() != HOSTED:
        return addresses
    allow = [entry.strip() for entry in get_settings().datasource_allow_hosts if entry.strip()]
    if _host_allowed(host, allow):
        return addresses
    networks = _allowed_networks(allow)
    for address in addresses:
        if refused_kind(address) and not any(_unwrap(address) in n or address in n for n in networks):
            raise WebhookUrlRefused(
                f"webhook host {host[:200]!r} is not allowed on this server: loopback, private, link-local and "
                "metadata addresses are refused (an operator can allow hosts in ENGRAM_DATASOURCE_ALLOW_HOSTS)"
            )
    return addresses


def pinned_request(url: str, address: IPAddress) -> tuple[str, dict[str, str], dict[str, str]]:
    """The URL, headers and httpx extensions that reach exactly this checked address: the host is
    replaced by it, ``Host`` and the TLS server name (SNI and certificate check) keep the name. A DNS answer
    changed between the check and the connection (rebinding) cannot move the delivery."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        ipaddress.ip_address(host)
        return url, {}, {}  # already an address
    except ValueError:
        pass
    literal = f"[{address}]" if address.version == 6 else str(address)
    netloc = literal if parts.port is None else f"{literal}:{parts.port}"
    extensions = {"sni_hostname": host} if parts.scheme == "https" else {}
    return urlunsplit(parts._replace(netloc=netloc)), {"host": parts.netloc}, extensions
