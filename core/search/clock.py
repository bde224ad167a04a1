"""Time spent in each search channel, recorded as ``engram_search_channel_seconds``.

The channels of one search interleave (full-text runs while the dense query is out; buckets ask each
channel for deeper rankings lazily), so a channel's figure is the time spent inside its own calls, summed
over the search. Nested timing is exclusive: time inside an inner channel's call is not also counted for
the outer one, so the figures of a search add up to at most its wall time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from core.metrics import SEARCH_CHANNEL_SECONDS

F = TypeVar("F", bound=Callable[..., Any])


class ChannelClock:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._running: list[tuple[str, float]] = []  # (channel, when its current stretch began)

    @contextmanager
    def timing(self, channel: str) -> Iterator[None]:
        now = time.perf_counter()
        if self._running:  # pause the outer channel while this one runs
            outer, began = self._running[-1]
            self.seconds[outer] = self.seconds.get(outer, 0.0) + now - began
        self._running.append((channel, now))
        try:
            yield
        finally:
            end = time.perf_counter()
            _, began = self._running.pop()
            self.seconds[channel] = self.seconds.get(channel, 0.0) + end - began
            if self._running:
                outer, _ = self._running[-1]
                self._running[-1] = (outer, end)

    def wrap(self, channel: str, fn: F) -> F:
        """``fn`` with its calls counted for ``channel``."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.timing(channel):
                return fn(*args, **kwargs)

        return timed  # type: ignore[return-value]

    def record(self) -> None:
        """Observe each channel's total for this search (once, when the search is done)."""
        for channel, seconds in self.seconds.items():
            SEARCH_CHANNEL_SECONDS.labels(channel).observe(seconds)
        self.seconds = {}
