"""How long the admin's session pages take on a short and on a very long session.

    python bench/admin_pages.py                  # 10 vs 100,000 messages, 15 requests each
    python bench/admin_pages.py --messages 20000 --repeat 30

Creates a throwaway test database (``test_<name>``, dropped at the end) and fills three
sessions through the adapter: 10 messages, 60 (so that a page of 50 is full, as on the long
one) and ``--messages``. Then times the transcript page at the newest messages, the oldest,
the middle (``?at=``) and one page back (``?before=``), and the changelist with and without a
message-text search, through Django's test client (template rendering included, no network).
Prints the messages shown, the median and 90th percentile in milliseconds, and the number and
total time of the SQL queries of the last request; then the plan PostgreSQL chooses for a page
in the middle of the long session.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=100_000, help="size of the long session")
    parser.add_argument("--repeat", type=int, default=15, help="timed requests per page")
    args = parser.parse_args()

    import django

    django.setup()
    from django.conf import settings
    from django.db import connection
    from django.test.utils import CaptureQueriesContext, setup_test_environment

    setup_test_environment()
    settings.ALLOWED_HOSTS = ["*"]
    old_name = connection.settings_dict["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        run(args, connection, CaptureQueriesContext)
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)


def fill(memory, n: int) -> None:
    batch = 1000
    for start in range(0, n, batch):
        memory.add_many(
            [
                {
                    "role": "user" if i % 2 == 0 else "assistant",
                    "content": f"Message {i}: " + "some words of a conversation " * 4,
                }
                for i in range(start, min(start + batch, n))
            ]
        )


def run(args, connection, CaptureQueriesContext) -> None:
    from django.contrib.auth import get_user_model
    from django.test import Client

    from memory_app import Memory

    staff = get_user_model().objects.create_superuser("bench", "bench@example.com", "bench")
    client = Client()
    client.force_login(staff)

    started = time.perf_counter()
    short = Memory.session("short", namespace="bench")
    fill(short, 10)
    one_page = Memory.session("one-page", namespace="bench")
    fill(one_page, 60)  # a full page of 50 with some before it: renders as much as the long one
    long = Memory.session("long", namespace="bench")
    fill(long, args.messages)
    for memory, upto in ((short, 4), (one_page, 30), (long, args.messages // 2)):
        memory.save_snapshot("A summary of the first part.", upto=upto)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    print(f"filled {args.messages:,} + 10 messages in {time.perf_counter() - started:.1f} s\n")

    def page(memory, query: str = "") -> str:
        return f"/admin/memory_app/session/{memory.id}/change/{query}"

    cases = [
        ("transcript: newest page", lambda m, n: page(m)),
        ("transcript: oldest page (?after=0)", lambda m, n: page(m, "?after=0")),
        ("transcript: middle (?at=)", lambda m, n: page(m, f"?at={max(n // 2 - 50, 1)}")),
        ("transcript: one page back (?before=)", lambda m, n: page(m, f"?before={max(n - 9, 2)}")),
    ]

    def measure(label: str, size: str, url: str) -> None:
        assert client.get(url).status_code == 200  # warm up
        timings = []
        for _ in range(args.repeat):
            with CaptureQueriesContext(connection) as queries:
                t0 = time.perf_counter()
                response = client.get(url)
                timings.append((time.perf_counter() - t0) * 1000)
            assert response.status_code == 200
        p90 = statistics.quantiles(timings, n=10)[-1] if len(timings) > 1 else timings[0]
        sql_ms = sum(float(q["time"]) for q in queries) * 1000
        shown = response.content.count(b'class="mem-msg ')
        print(
            f"{label:40} {size:>9} {shown:>6} {statistics.median(timings):>10.1f} {p90:>8.1f}"
            f" {len(queries):>8} {sql_ms:>7.1f}"
        )

    print(
        f"{'request':40} {'session':>9} {'shown':>6} {'median ms':>10} {'p90 ms':>8} {'queries':>8}"
        f" {'sql ms':>7}"
    )
    for label, url_for in cases:
        for memory, size in ((short, 10), (one_page, 60), (long, args.messages)):
            measure(label, f"{size:,}", url_for(memory, size))
    # The changelist lists both sessions. A term found early stops the EXISTS at once; a term
    # found nowhere reads every message's text (an ILIKE scan): the honest worst case.
    measure("changelist", "both", "/admin/memory_app/session/")
    measure("changelist: search, text is found", "both", "/admin/memory_app/session/?q=words")
    measure("changelist: search, text is absent", "both", "/admin/memory_app/session/?q=zebra")

    if connection.vendor == "postgresql":
        from memory_app.models import Message

        qs = Message.objects.filter(session_id=long.id, seq__gt=args.messages // 2).order_by("seq")[
            :51
        ]
        print("\nplan of a page in the middle of the long session:")
        print(qs.explain(analyze=True))


if __name__ == "__main__":
    main()
