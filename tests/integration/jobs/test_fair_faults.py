"""The fair scheduler killed mid-claim: a relay process dies (kill -9) after committing its claim of both
lanes and before publishing anything. The claimed rows hold their lanes' in-flight slots until reconcile
sees their messages never came; a worker started afterwards still ends with every job done."""

from __future__ import annotations

import signal
import subprocess
import sys

import httpx
import pytest
from sqlalchemy import text

from tests.helpers.drills import embedded_count, new_tenant, running_drill, save_batches
from tests.helpers.processes import REPO, wait_for

pytestmark = pytest.mark.slow

# Claims like the relay (its own code), then dies before the publish: what a kill -9 between the two does.
_CLAIM_AND_DIE = """
import os, signal
from core.jobs.relay import RelayLimits, claim_lane
limits = RelayLimits(bulk_inflight=4, interactive_inflight=50)
claimed = [head.id for lane in ("bulk", "interactive") for head, _, _ in claim_lane(lane, limits=limits)]
print(len(claimed), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _orphans(tenant_ids: list[int]) -> int:
    """Jobs claimed (dispatched) and never run: no worker has run anything yet."""
    from core.db import system_connection

    with system_connection() as connection:
        return int(
            connection.execute(
                text(
                    "SELECT count(*) FROM jobs WHERE tenant_id = ANY(:t) AND state = 'queued'"
                    " AND dispatched_at IS NOT NULL"
                ),
                {"t": tenant_ids},
            ).scalar_one()
        )


def _unfinished(tenant_ids: list[int]) -> int:
    from core.db import system_connection

    with system_connection() as connection:
        return int(
            connection.execute(
                text("SELECT count(*) FROM jobs WHERE tenant_id = ANY(:t) AND state <> 'succeeded'"), {"t": tenant_ids}
            ).scalar_one()
        )


def test_a_relay_killed_between_claim_and_publish_loses_no_job(stack):
    with running_drill(stack) as drill:
        bulk_tenant, bulk_headers = new_tenant()
        fresh_tenant, fresh_headers = new_tenant()
        save_batches(drill.url, bulk_headers, total=1200, size=300)
        with httpx.Client(base_url=drill.url, headers=fresh_headers, timeout=30) as http:
            for n in range(3):
                assert http.post("/v1/memories", json={"content": f"fresh note {n}"}).status_code == 201
        tenants = [bulk_tenant, fresh_tenant]
        relay = subprocess.run(
            [sys.executable, "-c", _CLAIM_AND_DIE], cwd=REPO, env=drill.env, capture_output=True, timeout=60
        )
        assert relay.returncode == -signal.SIGKILL, relay.stderr.decode()[-2000:]
        claimed = int(relay.stdout.decode().split()[0])
        assert 0 < _orphans(tenants) <= claimed  # (it may also have claimed jobs earlier tests left queued)
        drill.start_worker()
        wait_for(lambda: embedded_count(bulk_tenant) == 1200 and embedded_count(fresh_tenant) == 3, timeout=180)
        wait_for(lambda: _unfinished(tenants) == 0, timeout=60)
