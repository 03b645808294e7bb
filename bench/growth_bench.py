"""How the store behaves as its tables grow: append, window, owner recall, the admin's session
list and search, and an owner's export and erase, measured at each size of one growing database.

    python bench/growth_bench.py                          # 100k, 300k, 1M, 3M, 10M messages
    python bench/growth_bench.py --sizes 100000,1000000   # other steps
    python bench/growth_bench.py --quick                  # 20k, 100k (a smoke run)

The database (``bench_growth``, dropped first) is filled step by step in SQL, as the append
would leave it after its after-append job: sessions of 100 messages (so 10M messages are
100,000 sessions), 100 sessions per owner, every tenth message embedded (384-dimensional
vectors under the lexical embedder's name, so the query's own embedding costs next to
nothing and the figure is the database's), full-text vectors filled. After each step it runs
ANALYZE and measures through the public API (the adapter, Django's test client for the
admin) with the store-alone settings of ``store_bench.py``. The largest size in a run is what
the machine's disk and time allow; the curve over the steps shows the trend beyond it.

Writes ``results/growth.md`` and ``results/growth.png``.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RESULTS, markdown_table, percentile, setup_django  # noqa: E402

MESSAGES_PER_SESSION = 100
SESSIONS_PER_OWNER = 100
EMBED_EVERY = 10  # one message in ten has a vector
DIMENSIONS = 384
STORE_ONLY = {
    "SUMMARIZE_THRESHOLD_TOKENS": None,
    "EMBED_ON_APPEND": False,
    "IMPORTANCE_THRESHOLD": None,
    "MEMORY_EXTRACTOR": None,
    "EMBEDDER": "memory_app.providers.embeddings.LexicalEmbedder",
    "EMBEDDER_OPTIONS": {"dimensions": DIMENSIONS},
}
# Sentences the messages are drawn from: search terms then hit some sessions and miss others.
TOPICS = (
    "shipping times for the order to Oslo",
    "a refund for the broken kettle",
    "the hiking trip planned for June",
    "which laptop suits video editing",
    "the invoice that was charged twice",
    "a recipe for lentil soup",
    "moving the meeting to Thursday",
    "the password reset email never arrived",
    "train tickets from Lyon to Milan",
    "the dentist appointment next week",
    "tracking number of the parcel",
    "the garden fence needs painting",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100000,300000,1000000,3000000,10000000")
    parser.add_argument("--quick", action="store_true", help="20k and 100k messages")
    parser.add_argument("--repeat", type=int, default=40, help="timed calls per read figure")
    args = parser.parse_args()
    sizes = [20_000, 100_000] if args.quick else [int(s) for s in args.sizes.split(",")]

    started = time.perf_counter()
    load_at_start = os.getloadavg()
    setup_django("bench_growth", fresh=True, memory_app=STORE_ONLY)
    from django.conf import settings

    settings.ALLOWED_HOSTS = ["*"]
    from memory_app.providers.embeddings import get_embedder
    from memory_app.services.embedding import ensure_hnsw_index

    embedder = get_embedder()
    ensure_hnsw_index(embedder.name, DIMENSIONS)

    rows = []
    filled = 0
    for size in sizes:
        t0 = time.perf_counter()
        fill(filled, size, embedder.name)
        fill_seconds = time.perf_counter() - t0
        filled = size
        figures = measure(size, args.repeat)
        figures["fill_s"] = fill_seconds
        figures["load"] = os.getloadavg()[0]
        rows.append(figures)
        print_row(figures)

    write_results(rows, load_at_start, time.perf_counter() - started, args)


# -- filling ------------------------------------------------------------------------------------


def fill(start_messages: int, end_messages: int, model: str) -> None:
    """Add the sessions (with their owners, messages and vectors) between the two sizes."""
    from django.db import DatabaseError, connection

    from memory_app.services.embedding import ensure_hnsw_index, hnsw_index_name

    first = start_messages // MESSAGES_PER_SESSION
    last = end_messages // MESSAGES_PER_SESSION  # sessions [first, last)
    chunk = 2_000  # sessions per statement: 200,000 messages
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO auth_user (password, is_superuser, username, first_name, last_name, "
            "email, is_staff, is_active, date_joined) "
            "SELECT '!', false, 'owner-' || o, '', '', '', false, true, now() "
            "FROM generate_series(%s, %s) o ON CONFLICT (username) DO NOTHING",
            [first // SESSIONS_PER_OWNER, (last - 1) // SESSIONS_PER_OWNER],
        )
        # The vectors go in with the HNSW index dropped, and it is built again after: a bulk
        # build is about 8x faster than inserting vectors one by one (hours at a million) and
        # gives an index of the same kind; the app's own inserts are measured by the appends.
        cursor.execute(f"DROP INDEX IF EXISTS {connection.ops.quote_name(hnsw_index_name(model))}")
        for lo in range(first, last, chunk):
            hi = min(lo + chunk, last)
            fill_sessions(cursor, lo, hi, model)
            print(f"  filled sessions {lo:,}..{hi:,}", end="\r", flush=True)
        print(
            f"\n  building the HNSW index of {last * MESSAGES_PER_SESSION // EMBED_EVERY:,} vectors"
        )
        cursor.execute("SET maintenance_work_mem = '4GB'")  # the graph built in memory
        ensure_hnsw_index(model, DIMENSIONS)
        cursor.execute("RESET maintenance_work_mem")
        cursor.execute("VACUUM ANALYZE")
        # Write the fill's pages out now, so that the checkpoint after a fill of gigabytes
        # does not share the disk with the measurements. (It was not why the first reads at
        # 10M were slow: with it they still are; the cold/warm passes in measure() show why.)
        try:
            cursor.execute("CHECKPOINT")
        except DatabaseError:  # not a superuser (nor pg_checkpoint) on this server
            print("  (no CHECKPOINT: the role may not; measuring anyway)")
    print()


def fill_sessions(cursor, lo: int, hi: int, model: str) -> None:
    topics = list(TOPICS)
    # Sessions: updated over the last year, newest with the highest number.
    cursor.execute(
        "INSERT INTO memory_app_session (id, owner_id, namespace, key, title, metadata, "
        "created_at, updated_at, next_seq, message_count, token_count, tokens_since_snapshot, "
        "extracted_upto) "
        "SELECT md5('session-' || s)::uuid, u.id, 'growth', 'conversation-' || s, "
        "'Conversation ' || s || ' about ' || (%s::text[])[1 + s %% %s], '{}', "
        "now() - interval '1 year' + s * interval '1 second', "
        "now() - interval '1 year' + s * interval '1 second', %s, %s, %s * 30, %s * 30, 0 "
        "FROM generate_series(%s, %s) s JOIN auth_user u ON u.username = 'owner-' || (s / %s)",
        [
            topics,
            len(topics),
            MESSAGES_PER_SESSION + 1,
            MESSAGES_PER_SESSION,
            MESSAGES_PER_SESSION,
            MESSAGES_PER_SESSION,
            lo,
            hi - 1,
            SESSIONS_PER_OWNER,
        ],
    )
    # Messages: each session mixes three topics, turn by turn.
    cursor.execute(
        "INSERT INTO memory_app_message (session_id, seq, role, content, name, tool_call_id, "
        "metadata, token_count, remember, created_at, index_pending, search_vector) "
        "SELECT md5('session-' || s)::uuid, m, "
        "CASE WHEN m %% 2 = 1 THEN 'user' ELSE 'assistant' END, t.content, '', '', '{}', 30, "
        "false, now() - interval '1 year' + s * interval '1 second', false, "
        "to_tsvector('english', t.content) "
        "FROM generate_series(%s, %s) s CROSS JOIN generate_series(1, %s) m "
        "CROSS JOIN LATERAL (SELECT 'Turn ' || m || ' of conversation ' || s || ': about ' || "
        "(%s::text[])[1 + (s * 7 + m / 10) %% %s] || ', as we said about ' || "
        "(%s::text[])[1 + (s * 3 + m) %% %s] || ' before.' AS content) t",
        [lo, hi - 1, MESSAGES_PER_SESSION, topics, len(topics), topics, len(topics)],
    )
    # Vectors: random directions (the index's cost does not depend on what they mean).
    cursor.execute(
        "INSERT INTO memory_app_embedding (message_id, session_id, owner_id, cursor, role, "
        "content, message_created_at, model, dimensions, vector, created_at) "
        "SELECT msg.id, msg.session_id, ses.owner_id, msg.seq, msg.role, '', msg.created_at, "
        "%s, %s, (SELECT array_agg(random() - 0.5 + 0 * d + 0 * msg.id) "
        "FROM generate_series(1, %s) d)::vector, now() "
        "FROM memory_app_message msg JOIN memory_app_session ses ON ses.id = msg.session_id "
        "WHERE ses.key IN (SELECT 'conversation-' || s FROM generate_series(%s, %s) s) "
        "AND ses.namespace = 'growth' AND msg.seq %% %s = 0",
        [model, DIMENSIONS, DIMENSIONS, lo, hi - 1, EMBED_EVERY],
    )


# -- measuring ----------------------------------------------------------------------------------


def timed(fn, repeat: int) -> list[float]:
    fn()  # warm-up
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return samples


def measure(size: int, repeat: int) -> dict:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client

    from memory_app import Memory
    from memory_app.models import Embedding, Message, Session

    rng = random.Random(size)
    sessions = size // MESSAGES_PER_SESSION
    owners = (sessions - 1) // SESSIONS_PER_OWNER + 1
    User = get_user_model()

    def session_of(n: int):
        # Owners erased at earlier steps took their sessions: the next one that is there.
        session = (
            Session.objects.select_related("owner")
            .filter(
                namespace="growth", key__in=[f"conversation-{n + k}" for k in range(0, 500, 100)]
            )
            .first()
        )
        return Memory.get(session.id, owner=session.owner)

    figures: dict = {"messages": Message.objects.count(), "sessions": sessions}
    figures["embeddings"] = Embedding.objects.count()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_database_size(current_database())")
        figures["db_mb"] = cursor.fetchone()[0] / 2**20

    # Appends to sessions spread over the table (each a new message at the session's end).
    targets = [session_of(rng.randrange(sessions)) for _ in range(repeat)]
    samples = []
    for memory in targets:
        t0 = time.perf_counter()
        memory.add({"role": "user", "content": "One more question about the parcel, please."})
        samples.append((time.perf_counter() - t0) * 1000)
    figures["append_p50"], figures["append_p95"] = (
        statistics.median(samples),
        percentile(samples, 0.95),
    )

    # Reads of sessions picked at random, then the same reads again: the first pass reads what
    # is not in memory (a session not touched since the fill, as a user back after months),
    # the second what the first left there.
    windows = [session_of(rng.randrange(sessions)) for _ in range(repeat)]
    it = iter(windows * 2)
    samples = timed(lambda: next(it).window(max_tokens=8000), repeat)
    figures["window_p50"] = statistics.median(samples)
    it = iter(windows * 2)
    figures["window_warm_p50"] = statistics.median(
        timed(lambda: next(it).window(max_tokens=8000), repeat)
    )

    # Owner recall: hybrid search over the owner's 100 sessions (10,000 messages, 1,000 vectors).
    owner_sessions = [session_of(rng.randrange(owners) * SESSIONS_PER_OWNER) for _ in range(repeat)]
    asked = [
        (m, t.split(" ")[-1] + " " + t.split(" ")[1])
        for m, t in zip(owner_sessions, TOPICS * 9, strict=False)
    ]
    queries = iter(asked * 2)

    def recall():
        memory, query = next(queries)
        return memory.search(query, scope="owner", limit=10)

    samples = timed(recall, repeat)
    figures["recall_p50"], figures["recall_p95"] = (
        statistics.median(samples),
        percentile(samples, 0.95),
    )
    queries = iter(asked * 2)
    figures["recall_warm_p50"] = statistics.median(timed(recall, repeat))

    # The admin, as a signed-in superuser sees it (templates rendered, no network).
    staff, _ = User.objects.get_or_create(
        username="growth-admin", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(staff)
    one = session_of(sessions // 2)
    pages = {
        "admin_list": "/admin/memory_app/session/",
        "admin_list_deep": f"/admin/memory_app/session/?p={max(1, min(200, Session.objects.count() // 50))}",
        "admin_search_hit": "/admin/memory_app/session/?q=kettle",
        "admin_search_miss": "/admin/memory_app/session/?q=zebra",
        "admin_session": f"/admin/memory_app/session/{one.id}/change/",
    }
    for name, url in pages.items():
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
        samples = timed(lambda url=url: client.get(url), max(5, repeat // 4))
        figures[name] = statistics.median(samples)
        figures[name + "_p95"] = percentile(samples, 0.95)

    # An owner's export (streamed, as the command writes it) and erase: timed, then the peak of
    # the Python heap traced on another owner (tracing slows the calls, so not while timed).
    def traced(fn) -> float:
        gc.collect()
        tracemalloc.start()
        try:
            fn()
            return tracemalloc.get_traced_memory()[1] / 2**20
        finally:
            tracemalloc.stop()

    def owner_of(n: int):
        return User.objects.get(pk=session_of(n).owner_id)

    def export(owner) -> int:
        return sum(len(piece) for piece in Memory.iter_owner_export(owner))

    timed_owner, traced_owner = owner_of(rng.randrange(sessions)), None
    t0 = time.perf_counter()
    figures["export_bytes"] = export(timed_owner)
    figures["export_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    Memory.erase_owner(timed_owner)
    figures["erase_s"] = time.perf_counter() - t0
    traced_owner = owner_of(rng.randrange(sessions))
    figures["export_peak_mb"] = traced(lambda: export(traced_owner))
    figures["erase_peak_mb"] = traced(lambda: Memory.erase_owner(traced_owner))
    return figures


# -- reporting ----------------------------------------------------------------------------------

COLUMNS = (
    ("messages", "messages", "{:,}"),
    ("sessions", "sessions", "{:,}"),
    ("embeddings", "vectors", "{:,}"),
    ("db_mb", "database (MiB)", "{:,.0f}"),
    ("append_p50", "append p50 / p95 (ms)", None),
    ("window_p50", "window 8k, p50 (ms)", "{:.2f}"),
    ("recall_p50", "owner recall p50 / p95 (ms)", None),
    ("window_warm_p50", "again, warm: window / recall p50 (ms)", None),
    ("admin_list", "admin list (ms)", "{:.0f}"),
    ("admin_list_deep", "admin list, page 200 (ms)", "{:.0f}"),
    ("admin_search_hit", "admin search, found (ms)", "{:.0f}"),
    ("admin_search_miss", "admin search, absent (ms)", "{:.0f}"),
    ("admin_session", "admin session page (ms)", "{:.0f}"),
    ("export_s", "export owner: s, peak MiB", None),
    ("erase_s", "erase owner: s, peak MiB", None),
    ("load", "load average", "{:.1f}"),
)


def cells(f: dict) -> list[str]:
    out = []
    for key, _, fmt in COLUMNS:
        if key == "append_p50":
            out.append(f"{f['append_p50']:.2f} / {f['append_p95']:.2f}")
        elif key == "recall_p50":
            out.append(f"{f['recall_p50']:.1f} / {f['recall_p95']:.1f}")
        elif key == "window_warm_p50":
            out.append(f"{f['window_warm_p50']:.2f} / {f['recall_warm_p50']:.1f}")
        elif key == "export_s":
            out.append(f"{f['export_s']:.2f} s, {f['export_peak_mb']:.1f}")
        elif key == "erase_s":
            out.append(f"{f['erase_s']:.2f} s, {f['erase_peak_mb']:.1f}")
        else:
            out.append(fmt.format(f[key]))
    return out


def print_row(f: dict) -> None:
    for (_, label, _), cell in zip(COLUMNS, cells(f), strict=True):
        print(f"  {label:32} {cell}")
    print(f"  {'filled in':32} {f['fill_s']:.0f} s")


def write_results(rows: list[dict], load_at_start, seconds: float, args) -> None:
    import platform

    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        server = cursor.fetchone()[0]
    table = markdown_table([label for _, label, _ in COLUMNS], [cells(r) for r in rows])
    largest = rows[-1]
    admin_worst = max(
        largest[k]
        for k in (
            "admin_list",
            "admin_list_deep",
            "admin_search_hit",
            "admin_search_miss",
            "admin_session",
        )
    )
    command = "python bench/growth_bench.py" + (
        " --quick" if args.quick else f" --sizes {args.sizes}"
    )
    text = f"""# Growth benchmark

{table}

Slowest admin page at the largest size: {admin_worst:.0f} ms (median; the target is under 300 ms).

- One database grown step by step: sessions of {MESSAGES_PER_SESSION} messages, {SESSIONS_PER_OWNER} sessions per owner, one message in {EMBED_EVERY} with a {DIMENSIONS}-dimensional vector (HNSW index), full-text vectors filled, as the after-append job leaves them. Filled in SQL with the HNSW index dropped, which is then built again in one go (inserting a million vectors one by one would take hours here), then VACUUM ANALYZE and a CHECKPOINT (so that writing the fill's pages out does not share the disk with the measurements); filling each step took {", ".join(f"{r['fill_s']:.0f} s" for r in rows)}.
- Append: a single `add()` to a session picked at random (store-alone settings); window: `window(max_tokens=8000)` of a random session; *again, warm*: the same windows and searches a second time, when what the first pass read is in memory (the first pass reads sessions not touched since the fill, as for a user back after months); owner recall: `search(scope="owner", limit=10)` hybrid (full text and vectors) over one owner's {SESSIONS_PER_OWNER * MESSAGES_PER_SESSION:,} messages, the lexical embedder so that the figure is the database's work.
- Admin: Django's test client as a signed-in superuser (templates rendered, no network), median of repeated requests: the session list (first page and page 200), a search for a word some sessions hold ("kettle") and one none holds ("zebra"), one session's page.
- Export: `iter_owner_export` of one owner ({SESSIONS_PER_OWNER} sessions, {SESSIONS_PER_OWNER * MESSAGES_PER_SESSION:,} messages) consumed to the end; erase: `erase_owner` of the same owner. Peak: the Python heap traced (tracemalloc) during the same calls on another owner, not while timed.
- Load average is the 1-minute figure after each step's measurements (2 cores).
- Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, PostgreSQL {server}; load average at start {" ".join(f"{x:.1f}" for x in load_at_start)}; the run took {seconds:.0f} s.

![growth](growth.png)

Reproduce: `{command}`
"""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "growth.md").write_text(text)
    plot(rows)
    print(f"\nwrote {RESULTS / 'growth.md'}")


def plot(rows: list[dict]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no picture (pip install -e .[bench])")
        return
    x = [r["messages"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for key, label, style in (
        ("append_p50", "append p50", "-"),
        ("window_p50", "window 8k p50", "-"),
        ("recall_p50", "owner recall p50", "-"),
        ("recall_p95", "owner recall p95", "-"),
        ("window_warm_p50", "window 8k p50, warm", "--"),
        ("recall_warm_p50", "owner recall p50, warm", "--"),
    ):
        left.plot(x, [r[key] for r in rows], marker="o", linestyle=style, label=label)
    left.set_title("Agent calls (solid: sessions untouched since the fill)")
    for key, label in (
        ("admin_list", "session list"),
        ("admin_list_deep", "session list, page 200"),
        ("admin_search_hit", "search, found"),
        ("admin_search_miss", "search, absent"),
        ("admin_session", "session page"),
    ):
        right.plot(x, [r[key] for r in rows], marker="o", label=label)
    right.axhline(300, color="grey", linestyle="--", linewidth=1, label="300 ms")
    right.set_title("Admin pages")
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xlabel("messages stored")
        ax.set_ylabel("ms (median unless p95)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "growth.png", dpi=110)


if __name__ == "__main__":
    main()
