"""Read replicas against a real streaming replica: a primary and a hot standby on loopback
(``tests/replica.py``), and a Django process configured with both (``tests/replica_scenario.py``).

The scenario pauses the standby's replay before the reads below, so a read that went to the
replica shows it by its answer (the new message is missing), not only by the query counts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.replica import StreamingPair

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def facts():
    # Not under pytest's tmp folder: when run as root the servers run as another user, who
    # must be able to reach their data directories.
    pair = StreamingPair(Path(tempfile.mkdtemp(prefix="memory-replica-")))
    try:
        pair.start()
        env = {
            **os.environ,
            "DATABASE_URL": pair.primary_url,
            "REPLICA_DATABASE_URL": pair.replica_url,
            "DJANGO_SETTINGS_MODULE": "project.settings",
            "MEMORY_APP_JSON": "{}",
        }
        for name in ("CELERY_BROKER_URL", "REDIS_URL", "DB_TRANSACTION_POOLER"):
            env.pop(name, None)
        run = subprocess.run(
            [sys.executable, "-m", "tests.replica_scenario"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=200,
        )
        assert run.returncode == 0, run.stderr[-4000:]
        found = json.loads(run.stdout.strip().splitlines()[-1])
        print("replica facts:", json.dumps(found))
        yield found
    finally:
        pair.stop()


def test_the_replica_is_a_streaming_hot_standby(facts):
    assert facts["replica_in_recovery"] is True
    assert facts["pg_stat_replication"]["state"] == "streaming"
    # Loopback streaming: a committed append is readable on the standby within a second.
    assert facts["lag_ms"]["samples"] == 40 and facts["lag_ms"]["max"] < 1000


def test_the_agent_path_reads_its_own_writes_on_the_primary(facts):
    turn = facts["agent_turn"]
    assert turn["window_last"] == turn["last"] == turn["messages_first"] == turn["cursor"]
    assert turn["replica_queries"] == 0 and turn["primary_queries"] > 0
    # With no write before it either (a new request of the same agent): still the primary.
    later = facts["later_window"]
    assert later["window_last"] == turn["cursor"] and later["replica_queries"] == 0
    # Over HTTP, a POST then a window in the next request sees the message.
    api = facts["api_window"]
    assert api["posted"] == 201 and api["status"] == 200 and api["sees_post"] is True
    assert api["replica_queries"] == 0
    session = facts["session_search"]
    assert session["found_new"] is True and session["replica_queries"] == 0


def test_stale_tolerant_reads_go_to_the_replica(facts):
    owner = facts["owner_search"]
    assert owner["replica_queries"] >= 1 and owner["found_new"] is False  # replay is paused
    admin = facts["admin_list"]
    assert admin["status"] == 200 and admin["replica_queries"] >= 1
    idle = facts["idle_export"]
    assert idle["messages"] == 2 and idle["replica_queries"] >= 1
    # An active session's export reads the primary, whole.
    active = facts["active_export"]
    assert active["has_new"] is True and active["replica_queries"] == 0


def test_a_write_pins_its_context_to_the_primary(facts):
    pinned = facts["pinned_search"]
    assert pinned["found_new"] is True and pinned["replica_queries"] == 0
