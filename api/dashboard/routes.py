"""The operators' dashboard: a sign-in form, the page and its assets, and the JSON the page polls.

Sign-in sets a signed session cookie rather than an opaque token kept in memory, so any API process (or
replica) accepts it: the value is ``<expires>.<nonce>.<hmac>``, keyed by a secret derived from the
operator key. Rotating the operator key therefore ends every session. The cookie is HttpOnly and
SameSite=Strict; state-changing calls made with it must also carry the ``X-Engram-Dashboard`` header, which
a cross-site form cannot send, as a second guard against request forgery.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import json
import secrets
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Body, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response

from api.auth import bearer_token, is_operator_key
from api.dashboard import workers as dashboard_workers
from api.routes.jobs import abandon_as, discard_failed_as, retry_as, retry_failed_as
from api.routes.ops import coverage_rows, reindex_progress, set_reindex_paused
from api.threads import Route
from core.config import get_settings
from core.db import system_session
from core.errors import BadRequest, Forbidden, Invalid, NotFound, Unauthorized
from core.jobs import queries
from core.jobs.models import JOB_KINDS, JOB_STATES
from core.parsing import plain_int

router = APIRouter(prefix="/dashboard", route_class=Route)

STATIC_DIR = Path(__file__).resolve().parent / "static"
COOKIE_NAME = "engram_dashboard"
SESSION_SECONDS = 12 * 3600
CSRF_HEADER = "x-engram-dashboard"
_MAX_EXPIRES_DIGITS = 12
_MAX_ASSET_NAME_BYTES = 255
_CONTENT_TYPES = {".css": "text/css", ".js": "text/javascript", ".html": "text/html", ".png": "image/png"}
# Coverage reads every tenant's catalog; the page polls every few seconds, so it is cached briefly.
COVERAGE_TTL_SECONDS = 15.0
_coverage_cache: tuple[float, list[dict[str, Any]]] | None = None
_coverage_lock = threading.Lock()
MAX_CHART_HOURS = 168


def _session_secret(operator_key: str) -> bytes:
    return hmac.new(operator_key.encode(), b"engram dashboard session v1", hashlib.sha256).digest()


def _sign(payload: str, operator_key: str) -> str:
    return hmac.new(_session_secret(operator_key), payload.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


def make_session_cookie(*, operator_key: str, now: float | None = None) -> str:
    expires = int((now or time.time()) + SESSION_SECONDS)
    payload = f"{expires}.{secrets.token_urlsafe(16)}"
    return f"{payload}.{_sign(payload, operator_key)}"


def valid_session_cookie(value: str | None, *, operator_key: str, now: float | None = None) -> bool:
    if not value or not operator_key:
        return False
    payload, _, signature = value.rpartition(".")
    expires, _, _nonce = payload.partition(".")
    expires_at = plain_int(expires, max_digits=_MAX_EXPIRES_DIGITS)
    if expires_at is None or expires_at < (now or time.time()):
        return False
    # Bytes, not str: compare_digest raises TypeError on non-ASCII text, and the cookie is the client's.
    expected = _sign(payload, operator_key).encode()
    return hmac.compare_digest(signature.encode("utf-8", "surrogatepass"), expected)


def is_operator_request(request: Request) -> bool:
    """The operator key as Bearer, or a valid dashboard session cookie."""
    if is_operator_key(bearer_token(request)):
        return True
    return valid_session_cookie(request.cookies.get(COOKIE_NAME), operator_key=get_settings().operator_key)


def require_operator(request: Request, *, changes_state: bool = False) -> None:
    if is_operator_key(bearer_token(request)):
        return
    if not valid_session_cookie(request.cookies.get(COOKIE_NAME), operator_key=get_settings().operator_key):
        raise Unauthorized("this needs the operator key: send it as Bearer, or sign in at /dashboard")
    if changes_state and request.headers.get(CSRF_HEADER) != "1":
        raise Forbidden(f"dashboard calls that change state must send the {CSRF_HEADER} header")


def login_page(*, error: str | None = None, status: int = 200) -> HTMLResponse:
    page = (STATIC_DIR / "login.html").read_text()
    message = f'<p class="error" role="alert">{html.escape(error)}</p>' if error else ""
    return HTMLResponse(page.replace("<!--error-->", message), status_code=status)


@router.get("", include_in_schema=False)
@router.get("/", include_in_schema=False)
def dashboard_page(request: Request) -> Response:
    if not is_operator_request(request):
        return login_page()
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html", headers={"Cache-Control": "no-store"})


async def _submitted_key(request: Request) -> str:
    raw = (await request.body()).decode("utf-8", errors="replace")
    if request.headers.get("content-type", "").split(";")[0].strip().lower() == "application/json":
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, RecursionError):
            # RecursionError: arrays or objects nested thousands deep.
            raise BadRequest("the request body is not valid JSON") from None
        key = body.get("key") if isinstance(body, dict) else None
        return key.strip() if isinstance(key, str) else ""
    return (parse_qs(raw).get("key") or [""])[0].strip()


@router.post("/login", include_in_schema=False)
async def login(request: Request) -> Response:
    key = await _submitted_key(request)
    operator_key = get_settings().operator_key
    if not operator_key:
        return login_page(error="No operator key is configured (ENGRAM_OPERATOR_KEY).", status=401)
    if not is_operator_key(key):
        return login_page(error="That is not the operator key.", status=401)
    response = RedirectResponse("/dashboard", status_code=303)
    response.set_cookie(
        COOKIE_NAME,
        make_session_cookie(operator_key=operator_key),
        max_age=SESSION_SECONDS,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


@router.post("/logout", include_in_schema=False)
def logout() -> Response:
    response = RedirectResponse("/dashboard", status_code=303)
    response.delete_cookie(COOKIE_NAME, path="/", httponly=True, samesite="strict")
    return response


@router.get("/static/{name}", include_in_schema=False)
def static_asset(name: str) -> Response:
    # Only plain file names from the one folder: no path can climb out of it.
    path = STATIC_DIR / name
    if (
        "/" in name
        or "\0" in name
        or name.startswith(".")
        or len(name.encode("utf-8", "surrogatepass")) > _MAX_ASSET_NAME_BYTES
        or path.suffix not in _CONTENT_TYPES
        or not _is_file(path)
    ):
        raise NotFound(f"no dashboard asset {name[:100]!r}")
    return FileResponse(path, media_type=_CONTENT_TYPES[path.suffix], headers={"Cache-Control": "no-cache"})


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):  # a name too long for the file system, or one it cannot encode
        return False


def cached_coverage() -> list[dict[str, Any]]:
    global _coverage_cache
    with _coverage_lock:
        hit = _coverage_cache
    if hit is not None and hit[0] > time.monotonic():
        return hit[1]
    rows = coverage_rows(None)
    with _coverage_lock:
        _coverage_cache = (time.monotonic() + COVERAGE_TTL_SECONDS, rows)
    return rows


def forget_cached_coverage() -> None:
    global _coverage_cache
    with _coverage_lock:
        _coverage_cache = None


@router.get("/api/summary", include_in_schema=False)
def api_summary(request: Request) -> dict[str, Any]:
    require_operator(request)
    with system_session() as session:
        body = queries.summary(session, scope=None)
        # What the page's job filters offer.
        body.update(tenants=queries.tenant_list(session), kinds=list(JOB_KINDS), states=list(JOB_STATES))
    body["coverage"] = cached_coverage()
    return body


def _clean_text(params: dict[str, str], name: str, *, max_chars: int = 200) -> str | None:
    """A free-text filter the database will see: NUL (which PostgreSQL refuses) and huge values are 4xx."""
    value = params.get(name) or None
    if value is not None and ("\0" in value or len(value) > max_chars):
        raise Invalid(f"{name} must be at most {max_chars} characters without NUL", field=name)
    return value


@router.get("/api/jobs", include_in_schema=False)
def api_jobs(request: Request) -> dict[str, Any]:
    """Jobs of every tenant, newest first, filtered by tenant name, kind and state, a page at a time."""
    require_operator(request)
    params = dict(request.query_params)
    tenant_name = _clean_text(params, "tenant")
    _clean_text(params, "cursor", max_chars=1000)
    with system_session() as session:
        tenant_id = None
        if tenant_name:
            try:
                tenant_id = queries.tenant_id_by_name(session, name=tenant_name)
            except NotFound:
                raise Invalid(f"no tenant named {tenant_name!r}", field="tenant") from None
        filters = queries.parse_filters(params, tenant_id=tenant_id)
        jobs, next_cursor = queries.list_jobs(session, filters=filters, scope=None)
    return {"jobs": jobs, "next_cursor": next_cursor}


@router.get("/api/jobs/{job_id}", include_in_schema=False)
def api_job(job_id: str, request: Request) -> dict[str, Any]:
    """One job in full: payload, result, every attempt's error, timings, and the worker running it."""
    require_operator(request)
    if "\0" in job_id or len(job_id) > 100:
        raise NotFound("no such job")
    with system_session() as session:
        body = queries.job_detail(session, job_id=job_id)
    if body["state"] == "running":
        running_on = {j: w["name"] for w in dashboard_workers.workers()["workers"] if w["alive"] for j in w["job_ids"]}
        body["worker"] = running_on.get(job_id)
    return body


@router.get("/api/workers", include_in_schema=False)
def api_workers(request: Request) -> dict[str, Any]:
    """Celery workers (alive or last seen) with the jobs they run, and every running job's lease heartbeat."""
    require_operator(request)
    with system_session() as session:
        running = queries.running_jobs(session)
    body = dict(dashboard_workers.workers())
    by_id = {job["id"]: job for job in running}
    running_on: dict[str, str] = {}
    listed = []
    for worker in body["workers"]:
        jobs = [by_id[j] for j in worker["job_ids"] if j in by_id]
        for job in jobs:
            running_on[job["id"]] = worker["name"]
        listed.append({**worker, "jobs": jobs})
    body["workers"] = listed
    body["running"] = [{**job, "worker": running_on.get(job["id"])} for job in running]
    return body


@router.get("/api/throughput", include_in_schema=False)
def api_throughput(request: Request) -> dict[str, Any]:
    """Jobs finished and failed per hour, for the charts the page draws itself."""
    require_operator(request)
    hours = plain_int(request.query_params.get("hours", "24"), max_digits=4)
    if hours is None or not 1 <= hours <= MAX_CHART_HOURS:
        raise Invalid(f"hours must be an integer from 1 to {MAX_CHART_HOURS}", field="hours")
    with system_session() as session:
        return queries.throughput(session, hours=hours)


@router.post("/api/jobs/{job_id}/retry", include_in_schema=False)
def api_retry(job_id: str, request: Request) -> JSONResponse:
    require_operator(request, changes_state=True)
    return retry_as(job_id=job_id, scope=None)


# Operator actions: the REST calls' own code, with the dashboard's session (and its CSRF header) instead of
# the key; who did it is "dashboard" unless the form names someone.
@router.post("/api/jobs:retry", include_in_schema=False)
def api_retry_failed(request: Request, body: Any = Body(default=None)) -> JSONResponse:
    require_operator(request, changes_state=True)
    return JSONResponse(retry_failed_as(body), status_code=202)


@router.post("/api/jobs:discard", include_in_schema=False)
def api_discard_failed(request: Request, body: Any = Body(default=None)) -> dict[str, Any]:
    require_operator(request, changes_state=True)
    return discard_failed_as(body, by="dashboard")


@router.post("/api/jobs/{job_id}/discard", include_in_schema=False)
def api_discard(job_id: str, request: Request, body: Any = Body(default=None)) -> dict[str, Any]:
    require_operator(request, changes_state=True)
    return abandon_as(job_id, body, cancel=False, by="dashboard")


@router.post("/api/jobs/{job_id}/cancel", include_in_schema=False)
def api_cancel(job_id: str, request: Request, body: Any = Body(default=None)) -> dict[str, Any]:
    require_operator(request, changes_state=True)
    return abandon_as(job_id, body, cancel=True, by="dashboard")


@router.get("/api/reindex", include_in_schema=False)
def api_reindex(request: Request) -> dict[str, Any]:
    """The configured model's background reindex: state, done / remaining / ETA, the tenants left."""
    require_operator(request)
    return reindex_progress()


@router.post("/api/reindex:{action}", include_in_schema=False)
def api_reindex_action(action: str, request: Request, body: Any = Body(default=None)) -> dict[str, Any]:
    require_operator(request, changes_state=True)
    if action not in ("pause", "resume"):
        raise NotFound("no such action")
    return set_reindex_paused(body, paused=action == "pause", by="dashboard")
