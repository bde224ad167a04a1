"""Python clients of engram: :class:`EngramClient` (sync, REST), :class:`AsyncEngramClient` (the same
methods, awaitable) and ``EngramClient.local(...)`` (in-process). See :mod:`api.client.sync`."""

from api.client.aio import AsyncEngramClient
from api.client.base import EngramAPIError
from api.client.sync import EngramClient

__all__ = ["AsyncEngramClient", "EngramAPIError", "EngramClient"]
