"""What ``tests/test_replica.py`` runs in a subprocess configured as a deployment with a replica:
``DATABASE_URL`` is the primary, ``REPLICA_DATABASE_URL`` its hot standby, so the demo settings
turn on ``memory_app.routers.MemoryRouter`` and its middleware exactly as a project would.

It migrates the primary, writes, measures how long a committed append takes to show on the
standby, then pauses the standby's WAL replay (``pg_wal_replay_pause()``): from then on the
replica is stale for certain, and every read shows by its answer where it went. Prints one JSON
object of facts on its last line; the test asserts them.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import statistics
import sys
import time

import django


def main() -> dict:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    django.setup()

    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connections
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from memory_app import Memory
    from memory_app.models import Session
    from memory_app.routers import stale_reads, unpinned

    call_command("migrate", verbosity=0)
    primary, replica = connections["default"], connections["replica"]
    facts: dict = {}

    def on_replica(sql: str, params=()):
        with replica.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()

    facts["replica_in_recovery"] = on_replica("SELECT pg_is_in_recovery()")[0]

    users = get_user_model()._default_manager
    alice = users.create_user("alice", password="pw")
    users.create_superuser("staff", password="pw")
    mem = Memory.session("agent", owner=alice, namespace="bot")
    mem.add({"role": "system", "content": "You are a support agent."})

    # ---- replica lag: commit on the primary, poll the standby until it shows -------------------
    lags = []
    for i in range(40):
        stored = mem.add({"role": "user", "content": f"my parcel {i} is late"})
        started = time.perf_counter()
        while (
            on_replica(
                "SELECT count(*) FROM memory_app_message WHERE session_id = %s AND seq = %s",
                [mem.id, stored.cursor],
            )[0]
            == 0
        ):
            time.sleep(0.0002)
        lags.append((time.perf_counter() - started) * 1000)
    lags.sort()
    facts["lag_ms"] = {
        "samples": len(lags),
        "median": round(statistics.median(lags), 2),
        "p95": round(lags[int(len(lags) * 0.95) - 1], 2),
        "max": round(lags[-1], 2),
    }
    with primary.cursor() as cursor:
        cursor.execute(
            "SELECT state, extract(epoch FROM replay_lag) * 1000 FROM pg_stat_replication"
        )
        state, replay_lag = cursor.fetchone()
    facts["pg_stat_replication"] = {
        "state": state,
        "replay_lag_ms": None if replay_lag is None else round(float(replay_lag), 3),
    }

    # An idle session (nothing written for longer than REPLICA_IDLE_SECONDS), replicated.
    idle = Memory.session("archived", owner=alice, namespace="bot")
    idle.add_many(
        [
            {"role": "user", "content": "an old parcel question"},
            {"role": "assistant", "content": "it was delivered"},
        ]
    )
    Session.objects.filter(pk=idle.id).update(updated_at=timezone.now() - dt.timedelta(days=2))
    lsn = primary.cursor()
    lsn.execute("SELECT pg_current_wal_lsn()")
    target = lsn.fetchone()[0]
    while not on_replica("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [target])[0]:
        time.sleep(0.001)

    # ---- from here the replica is stale for certain ----------------------------------------------
    on_replica("SELECT pg_wal_replay_pause()")
    while on_replica("SELECT pg_get_wal_replay_pause_state()")[0] != "paused":
        time.sleep(0.01)

    def queries(block):
        with CaptureQueriesContext(primary) as on_p, CaptureQueriesContext(replica) as on_r:
            value = block()
        return value, len(on_p.captured_queries), len(on_r.captured_queries)

    # The agent path: append, then window / last / messages in the same context.
    def agent_turn():
        stored = mem.add({"role": "user", "content": "where is the courier now"})
        fresh = Memory.get(mem.id, owner=alice)
        return (
            stored.cursor,
            fresh.window(max_tokens=4000).cursors[-1],
            fresh.last(1)[0].cursor,
            fresh.messages(after=stored.cursor - 1)[0].cursor,
        )

    (cursor, window_last, last, listed), on_p, on_r = queries(agent_turn)
    facts["agent_turn"] = {
        "cursor": cursor,
        "window_last": window_last,
        "last": last,
        "messages_first": listed,
        "primary_queries": on_p,
        "replica_queries": on_r,
    }

    # A window in a later unit of work, with no write before it, still reads the primary.
    def later_window():
        with unpinned():
            return Memory.get(mem.id, owner=alice).window(max_tokens=4000).cursors[-1]

    window_last, on_p, on_r = queries(later_window)
    facts["later_window"] = {
        "window_last": window_last,
        "primary_queries": on_p,
        "replica_queries": on_r,
    }

    # Owner-scope search: stale-tolerant, answered by the replica (which lacks the new message).
    def owner_search():
        return [
            r.message.cursor
            for r in Memory.get(mem.id, owner=alice).search(
                "courier", scope="owner", mode="fulltext", limit=10
            )
        ]

    with unpinned():  # a new unit of work (this one has written)
        found, on_p, on_r = queries(owner_search)
    facts["owner_search"] = {
        "found_new": cursor in found,
        "primary_queries": on_p,
        "replica_queries": on_r,
    }
    with unpinned():
        found, on_p, on_r = queries(
            lambda: [
                r.message.cursor
                for r in Memory.get(mem.id, owner=alice).search(
                    "courier", scope="session", mode="fulltext"
                )
            ]
        )
    facts["session_search"] = {
        "found_new": cursor in found,
        "primary_queries": on_p,
        "replica_queries": on_r,
    }

    # A write pins the context: the same owner search right after an append reads the primary.
    def search_after_write():
        with stale_reads():
            mem.add({"role": "user", "content": "the courier rang twice"})
            return [
                r.message.content
                for r in Memory.get(mem.id, owner=alice).search(
                    "rang twice", scope="owner", mode="fulltext"
                )
            ]

    with unpinned():
        found, on_p, on_r = queries(search_after_write)
    facts["pinned_search"] = {
        "found_new": "the courier rang twice" in found,
        "primary_queries": on_p,
        "replica_queries": on_r,
    }

    # Exports: an idle session's messages come from the replica, an active one's from the primary.
    with unpinned():
        data, on_p, on_r = queries(lambda: Memory.get(idle.id, owner=alice).export())
    facts["idle_export"] = {
        "messages": len(data["messages"]),
        "primary_queries": on_p,
        "replica_queries": on_r,
    }
    with unpinned():
        data, on_p, on_r = queries(lambda: Memory.get(mem.id, owner=alice).export())
    facts["active_export"] = {
        "has_new": data["messages"][-1]["content"] == "the courier rang twice",
        "primary_queries": on_p,
        "replica_queries": on_r,
    }

    # Over HTTP: the admin's session list reads the replica; an API append then a window in the
    # next request (a new context) reads the primary.
    client = Client()
    client.login(username="staff", password="pw")
    with unpinned():
        response, on_p, on_r = queries(lambda: client.get("/admin/memory_app/session/"))
    facts["admin_list"] = {
        "status": response.status_code,
        "primary_queries": on_p,
        "replica_queries": on_r,
    }
    api = Client()
    api.login(username="alice", password="pw")
    base = f"/api/memory/sessions/{mem.id}"
    posted = api.post(
        f"{base}/messages/",
        {"role": "user", "content": "any news?"},
        content_type="application/json",
    )
    with unpinned():
        response, on_p, on_r = queries(lambda: api.get(f"{base}/window/?max_tokens=4000"))
    facts["api_window"] = {
        "posted": posted.status_code,
        "status": response.status_code,
        "sees_post": response.json()["cursors"][-1] == posted.json()["messages"][0]["cursor"],
        "primary_queries": on_p,
        "replica_queries": on_r,
    }

    on_replica("SELECT pg_wal_replay_resume()")
    return facts


if __name__ == "__main__":
    sys.stdout.write(json.dumps(main()) + "\n")
