"""What the hand-over between routed API processes costs and whether it holds, on a throwaway `engram serve`.

    ENGRAM_API_WORKERS=2 PYTHONPATH=/path/to/tree python scripts/routed_handover.py --calls 60

Revocations: each of ``--calls`` new keys is used on four new connections (spread over the processes that serve
the tenant), then revoked (timed), then used again on the same four connections: every one of those must be
refused. Usage: three requests, each on a new connection, then a timed `GET /v1/usage`; at the end the tenant's
count of requests must be every request sent. One line of figures.
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import time

import httpx

from api.bench.load import throwaway_serve
from api.bench.search import percentile


def _get(connection: http.client.HTTPConnection, headers: dict[str, str]) -> int:
    connection.request("GET", "/v1/memories?limit=1", headers=headers)
    response = connection.getresponse()
    response.read()
    return response.status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=60)
    args = parser.parse_args()
    with throwaway_serve(log=lambda _: None) as served:
        admin = {"Authorization": f"Bearer {served.tenant_keys(1)[0]}"}
        port = int(served.url.rsplit(":", 1)[1])
        revoking, accepted = [], 0
        with httpx.Client(base_url=served.url, headers=admin, timeout=30) as api:
            for n in range(args.calls):
                issued = api.post("/v1/keys", json={"user": f"handover{n}@example.com", "role": "member"}).json()
                headers = {"Authorization": f"Bearer {issued['api_key']}"}
                connections = [http.client.HTTPConnection("127.0.0.1", port, timeout=30) for _ in range(4)]
                try:
                    assert [_get(c, headers) for c in connections] == [200] * 4
                    started = time.perf_counter()
                    assert api.delete(f"/v1/keys/{issued['id']}").status_code == 200
                    revoking.append((time.perf_counter() - started) * 1000)
                    accepted += sum(_get(c, headers) == 200 for c in connections)
                finally:
                    for connection in connections:
                        connection.close()
        reading, sent = [], 0
        for _ in range(args.calls):
            for _ in range(3):
                httpx.get(f"{served.url}/v1/memories?limit=1", headers=admin, timeout=30)
            started = time.perf_counter()
            read = httpx.get(f"{served.url}/v1/usage", headers=admin, timeout=30)
            reading.append((time.perf_counter() - started) * 1000)
            assert read.status_code == 200, read.text
            sent += 4
        counted = read.json()["usage"]["requests"] - (4 * args.calls + args.calls * 2)  # (the revocation part's)
    print(
        f"revocation_p50_ms={statistics.median(revoking):.2f} revocation_p95_ms={percentile(revoking, 0.95):.2f} "
        f"accepted_after_revocation={accepted} usage_read_p50_ms={statistics.median(reading):.2f} "
        f"usage_read_p95_ms={percentile(reading, 0.95):.2f} usage_requests_counted={counted} of {sent}"
    )


if __name__ == "__main__":
    main()
