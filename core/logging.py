"""Process logging: one JSON object a line off a terminal, readable lines on one, secrets scrubbed.

Every line carries the request id of the request it serves (the API sets it per request; a worker sets it
from the job the request enqueued) and, while tracing is on, the trace and span ids, so one search in the
log store finds everything a call caused. Every formatted line, traceback included, goes through
``redact`` last: API keys, bearer tokens, passwords in URLs and ``password=``-style pairs, and the
process's own configured secrets never reach a log file.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.orjson import OrjsonFormatter

from core.config import get_settings

# The request id lives with the trace context (core.tracing), which carries both into jobs.
from core.tracing import REQUEST_ID, current_trace_ids

# Each pattern with what a line must contain for it to match (case-folded for the case-insensitive ones):
# a line without any is not searched by it (an access line, most lines, costs ~1 us instead of ~15 us).
_PATTERNS: tuple[tuple[re.Pattern[str], str, tuple[str, ...], bool], ...] = (
    # engram API and operator keys.
    (re.compile(r"\b(egk|egop)_[A-Za-z0-9_\-]+"), r"\1_***", ("egk_", "egop_"), False),
    (re.compile(r"(?i)\b(bearer)\s+[^\s\"',]+"), r"\1 ***", ("bearer",), True),
    # scheme://user:password@host
    (re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@\"']*):[^@\s/\"']*@"), r"\1:***@", ("://",), False),
    # password=..., "secret_key": "...", token: ...
    (
        re.compile(
            r"(?i)\b(password|passwd|pwd|secret|secret_key|operator_key|api_key|apikey|token)"
            r"([\"']?\s*[:=]\s*[\"']?)[^\s\"'&,;}]+"
        ),
        r"\1\2***",
        ("pass", "pwd", "secret", "key", "token"),
        True,
    ),
)
_secrets: set[str] = set()
_HANDLER_MARK = "_engram_handler"


@contextmanager
def request_id_scope(request_id: str | None) -> Iterator[None]:
    """Log lines written inside carry ``request_id`` (None: leave the current one as it is)."""
    if request_id is None:
        yield
        return
    token = REQUEST_ID.set(request_id)
    try:
        yield
    finally:
        REQUEST_ID.reset(token)


def add_secret(value: str | None) -> None:
    """A literal (a configured key, a password) that must never appear in a log line."""
    if value and len(value) >= 6:
        _secrets.add(value)


def redact(text: str) -> str:
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, "***")
    folded = text.casefold()  # what the (?i) patterns match case-insensitively, ſ and K (Kelvin) included
    for pattern, replacement, needs, ignore_case in _PATTERNS:
        within = folded if ignore_case else text
        if any(need in within for need in needs):
            text = pattern.sub(replacement, text)
            folded = text.casefold()
    return text


class ContextFilter(logging.Filter):
    """Adds ``request_id`` (and ``trace_id``/``span_id`` while tracing) to the records it passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = REQUEST_ID.get()
        if request_id is not None:
            record.request_id = request_id
        ids = current_trace_ids()
        if ids is not None:
            record.trace_id, record.span_id = ids
        return True


class JsonLines(OrjsonFormatter):
    """One JSON object a line, encoded by orjson (UTF-8 as it is, where json.dumps escaped non-ASCII)."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class ReadableLines(logging.Formatter):
    """``12:00:01 INFO    engram.api  message  request_id=...`` for a person at a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s  %(message)s", datefmt="%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        request_id = getattr(record, "request_id", None)
        if request_id is not None:
            first, newline, rest = line.partition("\n")
            line = f"{first}  request_id={request_id}{newline}{rest}"
        return redact(line)


def make_formatter(*, process: str, json_lines: bool) -> logging.Formatter:
    if not json_lines:
        return ReadableLines()
    return JsonLines(
        "{asctime}{levelname}{name}{message}",
        style="{",
        rename_fields={"asctime": "ts", "levelname": "level", "name": "logger"},
        static_fields={"process": process},
        datefmt="%Y-%m-%dT%H:%M:%S%z",
        reserved_attrs=[*RESERVED_ATTRS, "color_message"],  # uvicorn's copy of the message with ANSI colours
    )


def configure_logging(
    *, process: str, level: str | None = None, stream: TextIO | None = None, json_lines: bool | None = None
) -> None:
    """Route every logger of this process to one handler on stderr (idempotent: a second call replaces it).

    ``process`` names the emitter (api, worker, beat, cli) in each JSON line. Level and format come from the
    settings unless given.
    """

    settings = get_settings()
    _record_only_what_is_logged()
    for secret in (settings.operator_key, settings.secret_key):
        add_secret(secret)
    for url in (settings.database_url, settings.redis_url):
        add_secret(_url_password(url))
    target = stream if stream is not None else sys.stderr
    if json_lines is None:
        json_lines = not (hasattr(target, "isatty") and target.isatty())
    handler = logging.StreamHandler(target)
    handler.setFormatter(make_formatter(process=process, json_lines=json_lines))
    handler.addFilter(ContextFilter())
    setattr(handler, _HANDLER_MARK, True)
    root = logging.getLogger()
    for existing in list(root.handlers):
        if getattr(existing, _HANDLER_MARK, False) or type(existing) is logging.StreamHandler:
            root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel((level or settings.log_level).upper())
    # uvicorn's own loggers go through the root handler; its access log is replaced by ours (api.observe),
    # which knows the request id and the route.
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").disabled = True


def _record_only_what_is_logged() -> None:
    """Stop building the parts of each log record no line of ours shows: the caller's file, line and function
    (a walk up the stack per record), the thread's and the process's names. Neither formatter writes them (the
    JSON one leaves out every standard record attribute it is not told to show), and this is the logging
    HOWTO's own recipe ("Optimization"); it cost the access line of every request ~15% of its logging."""
    logging._srcfile = None  # type: ignore[attr-defined]
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


def _url_password(url: str) -> str | None:
    match = re.match(r"[A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@]*:([^@\s/]*)@", url or "")
    return match.group(1) if match else None
