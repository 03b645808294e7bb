"""Processes that append to one session at once, for the concurrency tests.

    DATABASE_URL=postgres://... python tests/reliability/appender.py SESSION_ID < plans.json

Reads a JSON list of plans from stdin, one per process. A plan is a list of steps, each a list
of messages: one message is appended with ``add``, more with ``add_many``. This launcher sets
Django up once, then forks one worker process per plan (each opens its own database
connection); the workers connect, wait until all are connected, run their plans at once, and
report what each step returned. Prints, as JSON, one list per plan of
``[[cursor, content, idempotency_key], ...]`` per step.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")


def work(session_id: str, plan: list, start, results, index: int) -> None:
    from django.db import connection

    from memory_app import Memory
    from memory_app.memory import ANY_OWNER

    try:
        mem = Memory.get(session_id, owner=ANY_OWNER)  # connects
        start.wait(timeout=60)
        returned = []
        for step in plan:
            stored = [mem.add(step[0])] if len(step) == 1 else mem.add_many(step)
            returned.append([[m.cursor, m.content, m.idempotency_key] for m in stored])
        results.put((index, returned, None))
    except BaseException as err:  # reported to the launcher, which fails
        results.put((index, None, f"{type(err).__name__}: {err}"))
    finally:
        connection.close()


def main() -> None:
    import django

    django.setup()
    from django.db import connections

    session_id = sys.argv[1]
    plans = json.load(sys.stdin)
    connections.close_all()  # no connection may be shared with the forked workers
    context = multiprocessing.get_context("fork")
    start = context.Barrier(len(plans))
    results = context.Queue()
    workers = [
        context.Process(target=work, args=(session_id, plan, start, results, i))
        for i, plan in enumerate(plans)
    ]
    for worker in workers:
        worker.start()
    collected = [results.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(timeout=30)
    errors = [err for _, _, err in collected if err]
    if errors or any(w.exitcode != 0 for w in workers):
        raise SystemExit(f"appender workers failed: {errors or [w.exitcode for w in workers]}")
    pids = {w.pid for w in workers}
    assert len(pids) == len(plans)
    print(json.dumps([returned for _, returned, _ in sorted(collected, key=lambda r: r[0])]))


if __name__ == "__main__":
    main()
