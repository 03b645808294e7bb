"""PostgreSQL restarted while the REST API is under load: errors (503) only during the outage,
correct service after it, and no acknowledged message lost.

gunicorn serves the project against a PostgreSQL server of this test's own (never the suite's),
which is stopped and started with pg_ctl while clients append (each message retried with its
idempotency key until acknowledged) and read windows. bench/api_faults.py runs the same for
longer, with more restarts, and reports the figures.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.live_api import (
    Gunicorn,
    LiveDatabase,
    RetryStats,
    SeparatePostgres,
    attribute_errors,
    restarts,
    retrying_clients,
    verify,
)

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def live_postgres():
    postgres = SeparatePostgres()
    yield postgres
    postgres.destroy()


def test_a_postgres_restart_under_load_loses_no_acknowledged_message(live_postgres):
    database = LiveDatabase(live_postgres.create_database("restart"))
    clients = database.prepare(users=8)
    with Gunicorn(database.url, workers=2, threads=4) as server:
        stop, stats = threading.Event(), RetryStats()
        threads = retrying_clients(server.base_url, clients, stop=stop, stats=stats)
        with restarts(live_postgres, times=1, every=3, down_for=1) as outages:
            pass
        acknowledged_at_restart = sum(map(len, stats.acknowledged.values()))
        time.sleep(3)  # service after the outage
        stop.set()
        for thread in threads:
            thread.join(70)
    assert not any(thread.is_alive() for thread in threads)

    [outage] = outages
    outside = attribute_errors(outages, stats.errors, grace=1.0)
    # The outage was felt (requests failed while the server was down), as 503s to retry...
    assert outage.errors_during > 0
    assert {what for _, what in stats.errors} == {"503"}
    # ...and only then: none before it, none a second after the restart.
    assert (outside, outage.errors_after) == (0, 0)
    # Service resumed: appends and windows were answered after the restart.
    assert sum(map(len, stats.acknowledged.values())) > acknowledged_at_restart
    assert stats.windows > 0

    verdict = verify(database, stats.acknowledged)
    assert verdict.ok, verdict.problems
    assert verdict.acknowledged == verdict.stored > 0
    assert verdict.unacknowledged_stored == 0  # every retried message was stored exactly once


@pytest.mark.parametrize("health_checks", [True, False])
def test_an_idle_connection_is_replaced_after_a_restart(live_postgres, health_checks):
    # One worker thread, so every request reuses its one kept database connection (CONN_MAX_AGE).
    # With CONN_HEALTH_CHECKS (the project's default) the first request after a restart finds
    # the dropped connection before using it and reconnects; without, that request fails (and
    # the next one reconnects): the check is what keeps a restart from costing a request.
    import httpx

    database = LiveDatabase(live_postgres.create_database(f"idle_{str(health_checks).lower()}"))
    [client] = database.prepare(users=1)
    with Gunicorn(database.url, workers=1, threads=1, health_checks=health_checks) as server:
        url = f"{server.base_url}/api/memory/sessions/{client.session_id}/messages/"
        headers = {"Authorization": f"Token {client.token}"}
        assert (
            httpx.post(url, json={"role": "user", "content": "before"}, headers=headers).status_code
            == 201
        )
        live_postgres.stop()
        live_postgres.start()
        first = httpx.post(url, json={"role": "user", "content": "after"}, headers=headers)
        second = httpx.post(url, json={"role": "user", "content": "again"}, headers=headers)
    if health_checks:
        assert (first.status_code, second.status_code) == (201, 201)
    else:
        assert (first.status_code, first.json()["code"]) == (503, "database_unavailable")
        assert first.headers["Retry-After"] == "1"
        assert second.status_code == 201
    stored = [content for _, content, _ in database.stored()[client.session_id]]
    assert stored == ["before", "after", "again"] if health_checks else ["before", "again"]
