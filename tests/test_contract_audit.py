"""Contract checks found missing by a black-box walk of CONTRACT.md (each test names the sentence it pins)."""

from __future__ import annotations

import os

from sqlalchemy.engine import make_url

from tests.test_catalog_support import create_and_ingest, sqlite_source


def test_an_unreachable_source_fails_the_ingest_job_on_its_first_attempt(client, tenant, tmp_path):
    """CONTRACT 5: "An unreachable source (missing SQLite file, ...) fails the job and changes nothing".

    With the server's real retry budget (not max_attempts=1), the job must read `failed` after one attempt,
    not sit `queued` in backoff for hours; a retry once the file is back then succeeds."""
    from core.config import get_settings
    from core.db import system_session
    from core.jobs.runner import run_job

    with sqlite_source(tmp_path) as (url, schema):
        create_and_ingest(client, tenant, url=url, schema=schema)
        path = make_url(url).database
        assert path is not None
        os.rename(path, f"{path}.moved")
        response = client.post("/v1/datasources/shop/ingest", headers=tenant.headers())
        assert response.status_code == 202, response.text
        job_id = response.json()["job_id"]
        outcome = run_job(job_id, session_factory=system_session, max_attempts=get_settings().job_max_attempts)
        job = client.get(f"/v1/jobs/{job_id}", headers=tenant.headers()).json()
        assert outcome.state == "failed" and job["state"] == "failed", job
        assert job["attempts"] == 1 and "no SQLite database file" in job["error"], job
        assert not os.path.exists(path)
        os.rename(f"{path}.moved", path)
        retried = client.post(f"/v1/jobs/{job_id}/retry", headers=tenant.headers())
        assert retried.status_code in (200, 202), retried.text
        assert run_job(job_id, session_factory=system_session, max_attempts=1).state == "succeeded"
