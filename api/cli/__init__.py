"""The `engram` command. Heavy imports stay inside the commands so `engram --help` and the REST-calling
commands start fast."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import click

from core import __version__


def _set_home(home: str | None) -> None:
    if home:
        os.environ["ENGRAM_HOME"] = str(Path(home).expanduser().resolve())
        from core.config import reset_settings_cache

        reset_settings_cache()


home_option = click.option(
    "--home", type=click.Path(file_okay=False), default=None, help="engram home (default ~/.engram)"
)


@click.group()
@click.version_option(__version__, "--version", prog_name="engram", message="%(prog)s %(version)s")
def main() -> None:
    """engram: memory for AI agents."""


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, type=int, show_default=True)
@home_option
def serve(host: str, port: int, home: str | None) -> None:
    """Run the whole service: API, worker, beat (and embedded PostgreSQL/Redis unless configured)."""
    from api.serve.stack import serve as run_serve
    from core.config import get_settings

    run_serve(host=host, port=port, home=Path(home) if home else get_settings().home)


@main.command()
@click.option("--host", default=None)
@click.option("--port", default=None, type=int)
@click.option("--workers", default=None, type=int, help="API worker processes")
@click.option("--migrate/--no-migrate", default=True, help="apply migrations first")
# A routed API process (api.serve.routed): it serves the connections its router passes over this descriptor.
@click.option("--handoff-fd", default=None, type=int, hidden=True)
@home_option
def api(
    host: str | None, port: int | None, workers: int | None, migrate: bool, handoff_fd: int | None, home: str | None
) -> None:
    """Run the HTTP API alone."""
    _set_home(home)

    from core.config import get_settings
    from core.logging import configure_logging

    settings = get_settings()
    configure_logging(process="api")
    from core.source_guard import describe_policy

    logging.getLogger("engram.api").info("%s", describe_policy())  # what tenants may connect to
    if migrate:
        from core.db import dispose_engine
        from core.migrate import upgrade

        upgrade()
        dispose_engine()  # nothing opened to migrate outlives it in a process that serves requests
    options: dict[str, Any] = dict(
        host=host or settings.host,
        port=port or settings.port,
        # Logging is ours (core.logging, configured again in each worker by api.main); the access log is
        # api.observe's, which knows the request id and the route.
        log_config=None,
        log_level=settings.log_level.lower(),
        access_log=False,
        # Forwarded headers are believed only from ENGRAM_TRUSTED_PROXIES, by api.app (not uvicorn's default).
        proxy_headers=False,
        timeout_keep_alive=settings.api_keep_alive_seconds,
        timeout_graceful_shutdown=settings.api_shutdown_timeout_seconds,
    )
    processes = workers or settings.api_workers
    if handoff_fd is not None:
        from api.serve.routed import run_handoff

        run_handoff("api.main:app", handoff_fd=handoff_fd, drain_seconds=settings.api_drain_seconds, **options)
    elif processes == 1:
        from api.serve.graceful import run_api

        run_api("api.main:app", drain_seconds=settings.api_drain_seconds, **options)
    else:  # a router holding the port, passing each key's connections to one of the processes
        from api.serve.routed import run_routed
        from core.runtime import engram_command

        argv = [*engram_command(), "api", "--no-migrate", "--workers", "1", *(["--home", home] if home else [])]
        sys.exit(
            run_routed(
                argv,
                host=options["host"],
                port=options["port"],
                processes=processes,
                per_tenant=settings.api_processes_per_tenant,
            )
        )


@main.command()
@click.option("--concurrency", default=2, type=int, show_default=True, help="threads of the bulk worker")
@click.option("--pool", default="threads", type=click.Choice(["threads", "prefork", "solo"]), show_default=True)
@click.option(
    "--queues",
    "lanes",
    default="all",
    type=click.Choice(["all", "interactive", "bulk"]),
    show_default=True,
    help="which lane's queue to consume; `all` runs a process per lane (supervised) so fresh saves never "
    "wait behind bulk work",
)
@click.option(
    "--supervise/--no-supervise",
    default=True,
    show_default=True,
    help="run Celery in a child process and restart it if it dies (a broker outage can end it)",
)
@home_option
def worker(concurrency: int, pool: str, lanes: str, supervise: bool, home: str | None) -> None:
    """Run the Celery worker (a process per lane: interactive and bulk)."""
    _set_home(home)
    from core.config import get_settings
    from core.jobs.lanes import QUEUES

    if supervise:
        from api.serve.supervise import run_supervised_group
        from core.runtime import engram_command

        def argv(lane: str, threads: int) -> list[str]:
            return [
                *engram_command(), "worker", f"--concurrency={threads}", f"--pool={pool}",
                f"--queues={lane}", "--no-supervise", *(["--home", home] if home else []),
            ]  # fmt: skip

        interactive = max(1, get_settings().worker_interactive_concurrency)
        children = {
            "interactive": {"worker-interactive": argv("interactive", interactive)},
            "bulk": {"worker-bulk": argv("bulk", concurrency)},
            "all": {"worker-interactive": argv("interactive", interactive), "worker-bulk": argv("bulk", concurrency)},
        }[lanes]
        sys.exit(run_supervised_group(children))
    from workers.celery_app import app

    queues = ",".join(QUEUES.values()) if lanes == "all" else QUEUES[lanes]  # type: ignore[index]
    # Two processes of one machine need their own node names, or Celery warns of a clash.
    options = [f"--loglevel={get_settings().log_level.upper()}", f"--concurrency={concurrency}", f"--pool={pool}"]
    sys.exit(run_celery(app, ["worker", *options, "-Q", queues, "-n", f"{lanes}@%h"]))


def run_celery(app: Any, argv: list[str]) -> int:
    """Run a `celery` sub-command on ``app`` and return its exit code.

    Celery's own ``app.worker_main``/``app.start`` drop it (the click command's return value is ignored), so
    a worker that died of an "Unrecoverable error" exited 0, and a manager that restarts only on failure
    (systemd on-failure, a Kubernetes Job) left it down. An exception that ends the command propagates
    (exit 1).
    """
    from celery.bin.celery import celery as celery_command
    from click.exceptions import Exit

    celery_command.params[0].default = app  # as app.start does: the -A option's value
    try:
        code = celery_command.main(args=argv, standalone_mode=False)
    except Exit as exc:
        code = exc.exit_code
    finally:
        celery_command.params[0].default = None
    return code if isinstance(code, int) else 0


@main.command()
@home_option
def beat(home: str | None) -> None:
    """Run the Celery beat scheduler (reconcile, lifecycle)."""
    _set_home(home)
    from core.config import get_settings
    from workers.celery_app import app

    schedule = get_settings().home / "celerybeat-schedule"
    schedule.parent.mkdir(parents=True, exist_ok=True)
    sys.exit(run_celery(app, ["beat", f"--loglevel={get_settings().log_level.upper()}", f"--schedule={schedule}"]))


@main.command()
@home_option
def migrate(home: str | None) -> None:
    """Apply database migrations."""
    _set_home(home)
    from api.cli.database import database_session_for_cli

    with database_session_for_cli():
        from core.migrate import upgrade

        upgrade()
    click.echo("migrations applied")


@main.command()
@click.option("--agent-id", envvar="ENGRAM_AGENT_ID", default=None, help="default agent identity of the tools")
@click.option("--persona", envvar="ENGRAM_PERSONA", default=None, help="default persona of the tools")
@click.option("--url", envvar="ENGRAM_URL", default=None, help="serve through this remote engram's REST API")
@click.option("--api-key", envvar="ENGRAM_API_KEY", default=None, help="the key the tools act for")
@home_option
def mcp(agent_id: str | None, persona: str | None, url: str | None, api_key: str | None, home: str | None) -> None:
    """Run an MCP server over stdio for one agent: on the same storage as serve, or with --url through a
    hosted engram's REST API."""
    _set_home(home)
    from api.mcp.stdio import McpStartupError, run_remote_stdio, run_stdio

    try:
        if url:
            run_remote_stdio(url=url, api_key=api_key, agent_id=agent_id, persona=persona)
        else:
            if api_key:
                os.environ["ENGRAM_API_KEY"] = api_key
            run_stdio(agent_id=agent_id, persona=persona)
    except McpStartupError as exc:
        raise click.ClickException(str(exc)) from None


from api.cli.admin import datasource, key  # noqa: E402
from api.cli.audit import audit  # noqa: E402
from api.cli.bench import bench, eval_  # noqa: E402 - registered after the group exists
from api.cli.catalog import ingest  # noqa: E402
from api.cli.demo import demo  # noqa: E402
from api.cli.memory import memory  # noqa: E402
from api.cli.ops import jobs, search  # noqa: E402
from api.cli.tenants import tenant  # noqa: E402

main.add_command(memory)
main.add_command(search)
main.add_command(jobs)
main.add_command(ingest)
main.add_command(bench)
main.add_command(eval_)
main.add_command(datasource)
main.add_command(key)
main.add_command(tenant)
main.add_command(demo)
main.add_command(audit)

