"""Keep one child process running: restart it when it dies on its own, stop it when asked to stop.

`engram worker` runs its Celery worker under this. A broker outage can end a Celery worker for good: when
Redis drops while the consumer holds unacknowledged messages, kombu's restore of them raises where no one
catches it ("Unrecoverable error") and the process exits. Committed jobs are never lost (the outbox and
reconcile bring them back), but nothing embeds them until a worker runs again: so the worker comes back by
itself, at most RESTARTS_PER_MINUTE times a minute, instead of relying on a process manager being there.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType

import click

RESTARTS_PER_MINUTE = 5
_PR_SET_PDEATHSIG = 1


def die_with_parent(death_signal: int) -> Callable[[], None]:
    """A ``preexec_fn`` that makes the child receive ``death_signal`` when this process dies."""

    def arm() -> None:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, death_signal)

    return arm


def restart_delay(restarts: list[float], now: float) -> float | None:
    """Count a death at ``now`` in ``restarts`` (the deaths of the last minute): the seconds to wait before
    starting the process again (1, 2, 4, ... at most 10), or None to give up (more than RESTARTS_PER_MINUTE)."""
    restarts[:] = [t for t in restarts if now - t < 60] + [now]
    if len(restarts) > RESTARTS_PER_MINUTE:
        return None
    return min(2.0 ** (len(restarts) - 1), 10.0)


def run_supervised(name: str, argv: Sequence[str]) -> int:
    """Run ``argv`` until it exits cleanly or this process is told to stop; returns its exit code.

    SIGTERM and SIGINT are passed on to the child (a Celery worker then finishes its tasks first). If this
    process is killed outright, the child is killed too (SIGKILL), exactly as if it had been the one killed.
    """
    return run_supervised_group({name: argv})


def run_supervised_group(children: Mapping[str, Sequence[str]]) -> int:
    """Run every child of ``children`` (name -> argv) as :func:`run_supervised` runs one, side by side.

    A child that exits cleanly is not restarted; one that gives up (too many restarts a minute) stops the
    others, and its code is returned. SIGTERM and SIGINT go to every running child.
    """
    stopping = threading.Event()
    running: dict[str, subprocess.Popen[bytes]] = {}
    codes: dict[str, int] = {}

    def forward(signum: int, frame: FrameType | None) -> None:
        stopping.set()
        for child in list(running.values()):
            if child.poll() is None:
                child.send_signal(signum)

    def keep(name: str, argv: Sequence[str]) -> None:
        restarts: list[float] = []
        while True:
            child = subprocess.Popen(list(argv), preexec_fn=die_with_parent(signal.SIGKILL))
            running[name] = child
            if stopping.is_set():  # asked to stop while it was starting
                child.terminate()
            code = child.wait()
            if stopping.is_set() or code == 0:
                codes[name] = code
                return
            delay = restart_delay(restarts, time.monotonic())
            if delay is None:
                click.echo(f"{name} exited with {code} {len(restarts)} times in a minute; giving up", err=True)
                codes[name] = code
                forward(signal.SIGTERM, None)
                return
            click.echo(f"{name} exited with {code}; restarting in {delay:.0f} s", err=True)
            stopping.wait(delay)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    threads = [threading.Thread(target=keep, args=item, name=f"supervise-{item[0]}") for item in children.items()]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        for thread in threads:  # joined in slices: signals are handled in this (the main) thread
            thread.join(timeout=0.5)
    return next((code for code in codes.values() if code != 0), 0)
