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

    def start(self, channel: str) -> None:
        now = time.perf_counter()
        running = self._running
        if running:  # pause the outer channel while this one runs
            outer, began = running[-1]
            self.seconds[outer] = self.seconds.get(outer, 0.0) + now - began
        running.append((channel, now))

    def stop(self) -> None:
        end = time.perf_counter()
        running = self._running
        channel, began = running.pop()
        self.seconds[channel] = self.seconds.get(channel, 0.0) + end - began
        if running:
            running[-1] = (running[-1][0], end)

    @contextmanager
    def timing(self, channel: str) -> Iterator[None]:
        self.start(channel)
        try:
            yield
        finally:
            self.stop()

    def wrap(self, channel: str, fn: F) -> F:
        """``fn`` with its calls counted for ``channel`` (a search makes a few dozen: no context manager each)."""
        start, stop = self.start, self.stop

        def timed(*args: Any, **kwargs: Any) -> Any:
            start(channel)
            try:
                return fn(*args, **kwargs)
            finally:
                stop()

        return timed  # type: ignore[return-value]

    def record(self) -> None:
        """Observe each channel's total for this search (once, when the search is done)."""
        for channel, seconds in self.seconds.items():
            observe = _observers.get(channel)
            if observe is None:
                observe = _observers[channel] = SEARCH_CHANNEL_SECONDS.labels(channel).observe
            observe(seconds)
        self.seconds = {}


# Each channel's histogram child, looked up once per process instead of once per search.
_observers: dict[str, Callable[[float], None]] = {}
