"""Datasource URLs at rest: Fernet-encrypted with the settings key, and redacted for display.

``ENGRAM_SECRET_KEY`` is used as the Fernet key when it is one (``engram serve`` generates such a key);
any other non-empty secret is stretched into one with SHA-256, so an operator may set a passphrase.
"""

from __future__ import annotations

import base64
import hashlib

from cryptography.fernet import Fernet, InvalidToken
from sqlalchemy.engine import URL

from core.config import get_settings
from core.errors import Unavailable

# Query parameters that may carry a secret (``?password=...``, ``?sslpassword=...``, tokens).
_SECRET_PARAM_HINTS = ("pass", "secret", "token", "pwd", "credential")


def _fernet() -> Fernet:
    secret = get_settings().secret_key
    if not secret:
        raise Unavailable("ENGRAM_SECRET_KEY is not set, so datasource credentials cannot be stored")
    try:
        return Fernet(secret.encode())
    except ValueError:
        return Fernet(base64.urlsafe_b64encode(hashlib.sha256(secret.encode()).digest()))


def encrypt_url(url: URL) -> str:
    return _fernet().encrypt(url.render_as_string(hide_password=False).encode()).decode()


def decrypt_url(token: str) -> str:
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken:
        raise Unavailable("the datasource URL cannot be decrypted: ENGRAM_SECRET_KEY changed") from None


def encrypt_secret(secret: str) -> str:
    """Any other secret at rest (a webhook's signing secret), with the same key as datasource URLs."""
    return _fernet().encrypt(secret.encode()).decode()


def decrypt_secret(token: str) -> str:
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken:
        raise Unavailable("a stored secret cannot be decrypted: ENGRAM_SECRET_KEY changed") from None


def redact_url(url: URL) -> str:
    """The URL without its password (``***``) nor secret-looking query parameters."""
    query = {
        key: ("***" if any(h in key.lower() for h in _SECRET_PARAM_HINTS) else value)
        for key, value in url.query.items()
    }
    return url.set(query=query).render_as_string(hide_password=True)


def secrets_of(url: URL) -> list[str]:
    """The literal secrets inside a URL, to scrub from error messages before they are stored."""
    found = [str(url.password)] if url.password else []
    for key, value in url.query.items():
        if any(h in key.lower() for h in _SECRET_PARAM_HINTS):
            found.extend([value] if isinstance(value, str) else list(value))
    return [s for s in found if s]


def scrub(message: str, *, url: URL) -> str:
    for secret in secrets_of(url):
        message = message.replace(secret, "***")
    return message
