"""Owner-scope semantic search at scale: latency and recall@10 of the HNSW path.

    python bench/search_bench.py --quick    # 20,000 messages, 100 queries
    python bench/search_bench.py            # 100,000 messages, 200 queries
    python bench/search_bench.py --fresh    # drop the bench_search database first

What it does, on the project's PostgreSQL server, in a database of its own (``bench_search``):

1. Stores messages for 20 owners (several sessions each) with one 384-dimension vector each,
   clustered the way sentence embeddings are: 400 topic centres shared by all owners, each
   owner talking about 30 of them, each vector a centre plus Gaussian noise, normalised (a
   vector's cosine similarity to its centre is about 0.7, to a neighbour of the same topic about
   0.5). Messages and vectors go in by binary ``COPY``: embedding 100,000 texts with a real
   model is not what is measured here. Loaded once per size, reused by later runs.
2. Builds the model's HNSW index with the app's own ``ensure_hnsw_index()`` (its ``HNSW_M`` and
   ``HNSW_EF_CONSTRUCTION`` settings), timed.
3. Searches through the adapter, ``SessionMemory.search(query, limit=10, scope="owner",
   mode="vector")``, with queries drawn like the messages (a centre of one of the owner's topics
   plus noise); the query text maps to its vector in a small table embedder, so no model runs.
   For each ``HNSW_EF_SEARCH`` value tried: median and p99 latency, and recall@10 against the
   exact answer (the same owner filter ordered by the uncast column, which no index serves).
4. Shows the plan of one search (``EXPLAIN ANALYZE``: the HNSW index, the owner filter, the
   iterative scan returning all 10), and the peak RSS of a fresh process running the searches
   and of its server backend.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from bench.common import (
    RESULTS,
    Latency,
    fmt_ms,
    libpq_params,
    markdown_table,
    peak_rss_mb,
    setup_django,
)
from memory_app.providers.embeddings import Embedder

DB_NAME = "bench_search"
DIMS = 384
TOPICS = 400
THEMES = 40
TOPICS_PER_OWNER = 30
TOPICS_PER_SESSION = 8
OWNERS = 20
NOISE = 1.0  # norm of the noise added to a unit topic centre
LIMIT = 10
EF_SEARCH_VALUES = (40, 100, 200, 400)


@dataclass(frozen=True)
class Mode:
    sessions_per_owner: int
    per_session: int
    queries: int

    @property
    def messages(self) -> int:
        return OWNERS * self.sessions_per_owner * self.per_session


QUICK = Mode(sessions_per_owner=4, per_session=250, queries=100)
FULL = Mode(sessions_per_owner=5, per_session=1000, queries=200)


def model_name(mode: Mode) -> str:
    # One model (so one partial HNSW index) per data size: the sizes coexist in the database.
    return f"bench-clustered-v2-{DIMS}-n{mode.messages}"


def owner_name(mode: Mode, index) -> str:
    return f"{model_name(mode)}-owner-{index}"


# -- the data ---------------------------------------------------------------------------------


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=-1, keepdims=True)).astype(np.float32)


class World:
    """Topic centres and who talks about what; the same for every run."""

    def __init__(self, seed: int = 42) -> None:
        rng = np.random.default_rng(seed)
        # Like sentence embeddings: a direction every text shares, broad themes, topics within
        # them; no region of the space is cut off from the rest.
        shared = unit(rng.standard_normal(DIMS))
        themes = unit(rng.standard_normal((THEMES, DIMS)))
        topics = unit(
            themes[np.arange(TOPICS) % THEMES] + 0.8 * unit(rng.standard_normal((TOPICS, DIMS)))
        )
        self.centres = unit(topics + 0.5 * shared)
        self.owner_topics = [
            rng.choice(TOPICS, TOPICS_PER_OWNER, replace=False) for _ in range(OWNERS)
        ]

    def sample(
        self, rng: np.random.Generator, topics: np.ndarray, count: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """``count`` unit vectors around centres picked from ``topics``, and their topics."""
        picked = rng.choice(topics, count)
        noise = rng.standard_normal((count, DIMS)) * (NOISE / np.sqrt(DIMS))
        return unit(self.centres[picked] + noise), picked


WORDS = (
    "plan budget trip garden recipe meeting deadline invoice doctor school train concert "
    "report holiday laptop coffee friend project weekend music book movie sister office"
).split()


def load(mode: Mode, settings_dict: dict, world: World) -> None:
    """Owners, sessions, messages and vectors of this size, unless they are there already."""
    import psycopg
    from django.contrib.auth import get_user_model
    from pgvector.psycopg import register_vector

    from memory_app.models import Embedding, Session

    model = model_name(mode)
    have = Embedding.objects.filter(model=model).count()
    if have == mode.messages:
        log(f"reusing {have:,} stored vectors of {model}")
        return
    if have:
        raise SystemExit(
            f"{model}: {have} vectors stored, expected {mode.messages}; run with --fresh"
        )
    log(f"loading {mode.messages:,} messages with vectors")
    began = time.perf_counter()
    User = get_user_model()
    rng = np.random.default_rng(mode.messages)
    with psycopg.connect(**libpq_params(settings_dict)) as conn:
        register_vector(conn)
        conn.execute("SET synchronous_commit = off")
        for o in range(OWNERS):
            owner, _ = User.objects.get_or_create(username=owner_name(mode, o))
            sessions = Session.objects.bulk_create(
                [
                    Session(
                        owner=owner,
                        key=f"s{s}",
                        next_seq=mode.per_session + 1,
                        message_count=mode.per_session,
                    )
                    for s in range(mode.sessions_per_owner)
                ]
            )
            with conn.cursor() as cur:
                for session in sessions:
                    topics = rng.choice(world.owner_topics[o], TOPICS_PER_SESSION, replace=False)
                    vectors, picked = world.sample(rng, topics, mode.per_session)
                    roles = ["user" if i % 2 == 0 else "assistant" for i in range(mode.per_session)]
                    texts = [f"topic {t}: " + " ".join(rng.choice(WORDS, 8)) for t in picked]
                    with cur.copy(
                        "COPY memory_app_message (session_id, seq, role, content, name, "
                        "tool_call_id, metadata, token_count, remember) FROM STDIN"
                    ) as copy:
                        for i in range(mode.per_session):
                            copy.write_row(
                                (session.pk, i + 1, roles[i], texts[i], "", "", "{}", 12, False)
                            )
                    cur.execute(
                        "SELECT id FROM memory_app_message WHERE session_id = %s ORDER BY seq",
                        [session.pk],
                    )
                    ids = [r[0] for r in cur.fetchall()]
                    with cur.copy(
                        "COPY memory_app_embedding (message_id, session_id, owner_id, model, "
                        "dimensions, vector, created_at) FROM STDIN WITH (FORMAT BINARY)"
                    ) as copy:
                        copy.set_types(
                            [
                                "bigint",
                                "uuid",
                                "integer",
                                "varchar",
                                "integer",
                                "vector",
                                "timestamptz",
                            ]
                        )
                        now = time.time()
                        stamp = _utc(now)
                        for mid, vector in zip(ids, vectors, strict=True):
                            copy.write_row((mid, session.pk, owner.pk, model, DIMS, vector, stamp))
            conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE memory_app_message")
        conn.execute("VACUUM ANALYZE memory_app_embedding")
    log(f"  loaded in {time.perf_counter() - began:.1f}s")


def _utc(epoch: float):
    import datetime as dt

    return dt.datetime.fromtimestamp(epoch, tz=dt.UTC)


def queries(mode: Mode, world: World) -> list[tuple[int, str, np.ndarray]]:
    """``(owner index, query text, vector)``: each query near a topic its owner has talked
    about (the topic of one of the owner's messages, picked at random)."""
    from memory_app.models import Message

    rng = np.random.default_rng(7)
    out = []
    for i in range(mode.queries):
        o = i % OWNERS
        owned = Message.objects.filter(session__owner__username=owner_name(mode, o))
        content = owned.order_by("id").values_list("content", flat=True)[
            int(rng.integers(owned.count()))
        ]
        topic = int(content.split(":")[0].removeprefix("topic "))
        vectors, _ = world.sample(rng, np.array([topic]), 1)
        out.append((o, f"bench query {i}", vectors[0]))
    return out


# -- the query embedder ------------------------------------------------------------------------

QUERY_VECTORS: dict[str, list[float]] = {}


class QueryTableEmbedder(Embedder):
    """Answers the benchmark's query texts with their precomputed vectors (no model runs)."""

    def __init__(self, name: str, dimensions: int) -> None:
        self.name = name
        self.dimensions = dimensions

    def _embed_batch(self, texts: list[str]) -> list[list[float]]:
        return [QUERY_VECTORS[t] for t in texts]


#: Index build settings given on the command line (HNSW_M, HNSW_EF_CONSTRUCTION).
BUILD_SETTINGS: dict = {}


def app_settings(mode: Mode, **extra) -> dict:
    return {
        "EMBEDDER": "bench.search_bench.QueryTableEmbedder",
        "EMBEDDER_OPTIONS": {"name": model_name(mode), "dimensions": DIMS},
        "EMBED_ON_APPEND": False,
        "IMPORTANCE_THRESHOLD": None,
        **BUILD_SETTINGS,
        **extra,
    }


# -- measuring ---------------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def build_index(mode: Mode, *, rebuild: bool) -> tuple[str, float | None]:
    from django.db import connection

    from memory_app.services.embedding import ensure_hnsw_index, hnsw_index_name

    name = hnsw_index_name(model_name(mode))
    with connection.cursor() as cursor:
        if rebuild:
            cursor.execute(f"DROP INDEX IF EXISTS {connection.ops.quote_name(name)}")
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [name])
        if cursor.fetchone()[0]:
            log(f"reusing index {name}")
            return name, None
        # The whole graph in memory: a build that spills is many times slower. Session-level.
        cursor.execute("SET maintenance_work_mem = '1GB'")
    log(f"building {name}")
    began = time.perf_counter()
    ensure_hnsw_index(model_name(mode), DIMS)
    elapsed = time.perf_counter() - began
    with connection.cursor() as cursor:
        cursor.execute("RESET maintenance_work_mem")
        cursor.execute("ANALYZE memory_app_embedding")
    log(f"  built in {elapsed:.1f}s")
    return name, elapsed


def sessions_by_owner(mode: Mode):
    from django.contrib.auth import get_user_model

    from memory_app import Memory

    User = get_user_model()
    owners = {u.username: u for u in User.objects.filter(username__startswith=owner_name(mode, ""))}
    return [
        Memory.session("s0", owner=owners[owner_name(mode, o)], create=False) for o in range(OWNERS)
    ]


def exact(mode: Mode, owner_id: int, vector: np.ndarray) -> list[int]:
    """The true top 10: the same filter, ordered by the uncast column (no index serves it)."""
    from django.db import connection, transaction

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_indexscan = off")  # belt and braces
        cursor.execute(
            "SELECT message_id FROM memory_app_embedding WHERE model = %s AND owner_id = %s "
            "ORDER BY vector <=> %s::vector, message_id LIMIT %s",
            [
                model_name(mode),
                owner_id,
                "[" + ",".join(map(repr, map(float, vector))) + "]",
                LIMIT,
            ],
        )
        return [r[0] for r in cursor.fetchall()]


def measure(
    mode: Mode, mems, qs, truth, ef_search: int, *, force_hnsw: bool, rounds: int = 2
) -> dict:
    from django.test.utils import override_settings

    with (
        override_settings(MEMORY_APP=app_settings(mode, HNSW_EF_SEARCH=ef_search)),
        planner(force_hnsw),
    ):
        plan = plan_of_one_search(mode, mems[qs[0][0]], qs[0][1])
        uses_hnsw = "Index Scan using memory_emb_hnsw_" in plan
        for o, text, _ in qs[:20]:  # warm-up: caches, the index's upper layers
            mems[o].search(text, LIMIT, scope="owner", mode="vector")
        samples, recalls, counts = [], [], []
        for r in range(rounds):
            for o, text, _ in qs:
                began = time.perf_counter()
                found = mems[o].search(text, LIMIT, scope="owner", mode="vector")
                samples.append(time.perf_counter() - began)
                if r == 0:
                    ids = [f.message.id for f in found]
                    counts.append(len(ids))
                    recalls.append(len(set(ids) & set(truth[text])) / LIMIT)
                    assert all(f.session_id in owner_sessions(mems[o]) for f in found)
    lat = Latency(samples)
    return {
        "ef_search": ef_search,
        "forced": force_hnsw,
        "hnsw": uses_hnsw,
        "plan": plan,
        "median": lat.median,
        "p99": lat.p99,
        "n": lat.count,
        "recall": float(np.mean(recalls)),
        "min_recall": float(np.min(recalls)),
        "min_count": min(counts),
    }


_SESSIONS: dict = {}


def owner_sessions(mem) -> set:
    from memory_app.models import Session

    if mem.session.owner_id not in _SESSIONS:
        _SESSIONS[mem.session.owner_id] = set(
            Session.objects.filter(owner_id=mem.session.owner_id).values_list("pk", flat=True)
        )
    return _SESSIONS[mem.session.owner_id]


def exact_latency(mode: Mode, mems, qs) -> Latency:
    samples = []
    for o, _, vector in qs[: min(50, len(qs))]:
        began = time.perf_counter()
        exact(mode, mems[o].session.owner_id, vector)
        samples.append(time.perf_counter() - began)
    return Latency(samples)


@contextlib.contextmanager
def planner(force_hnsw: bool):
    """With ``force_hnsw``, make the planner take the HNSW index over an exact scan of the
    owner's rows (session-level, so it holds inside the adapter's own transactions)."""
    from django.db import connection

    if not force_hnsw:
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("SET enable_sort = off")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET enable_sort")


def plan_of_one_search(mode: Mode, mem, text: str) -> str:
    """``EXPLAIN ANALYZE`` of the SQL one adapter search sends, under the search's settings."""
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from memory_app.services.recall import apply_hnsw_settings

    with CaptureQueriesContext(connection) as captured:
        mem.search(text, LIMIT, scope="owner", mode="vector")
    sql = next(q["sql"] for q in captured.captured_queries if "hits AS MATERIALIZED" in q["sql"])
    with transaction.atomic(), connection.cursor() as cursor:
        apply_hnsw_settings(cursor)
        cursor.execute("EXPLAIN (ANALYZE, COSTS OFF, BUFFERS OFF) " + sql)
        plan = "\n".join(r[0] for r in cursor.fetchall())
    return re.sub(r"'\[[-0-9.e,]+\]'", "'[…384 numbers…]'", plan)


def rss_probe(quick: bool) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--rss-probe", *(["--quick"] if quick else [])],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ),
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def probe_main(mode: Mode) -> None:
    """A fresh process: every query once, then its own peak RSS and its backend's."""
    from django.db import connection
    from django.test.utils import override_settings

    from bench import search_bench as this

    setup_django(DB_NAME)
    world = World()
    qs = queries(mode, world)
    this.QUERY_VECTORS.update({text: v.tolist() for _, text, v in qs})
    mems = sessions_by_owner(mode)
    with override_settings(MEMORY_APP=app_settings(mode)):
        for o, text, _ in qs:
            mems[o].search(text, LIMIT, scope="owner", mode="vector")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    backend = None
    try:
        with open(f"/proc/{pid}/status") as status:
            backend = next(
                int(line.split()[1]) / 1024 for line in status if line.startswith("VmHWM:")
            )
    except OSError:
        pass  # a server on another machine
    print(json.dumps({"peak_rss_mb": peak_rss_mb(), "backend_peak_rss_mb": backend}))


# -- main --------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="20,000 messages, 100 queries")
    parser.add_argument("--fresh", action="store_true", help="drop the bench_search database first")
    parser.add_argument(
        "--rebuild",
        action="store_true",
        help="drop and build the HNSW index again (after changing --m or --ef-construction)",
    )
    parser.add_argument("--m", type=int, help="HNSW_M for the index build (default: the app's)")
    parser.add_argument(
        "--ef-construction",
        type=int,
        help="HNSW_EF_CONSTRUCTION for the index build (default: the app's)",
    )
    parser.add_argument("--rss-probe", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--out",
        default=None,
        help="markdown file (default results/search.md, results/search-quick.md with --quick)",
    )
    args = parser.parse_args()
    mode = QUICK if args.quick else FULL
    os.environ.setdefault("DJANGO_DEBUG", "0")  # DEBUG keeps a log of every query
    if args.rss_probe:
        probe_main(mode)
        return 0

    started = time.perf_counter()
    BUILD_SETTINGS.update(
        {k: v for k, v in (("HNSW_M", args.m), ("HNSW_EF_CONSTRUCTION", args.ef_construction)) if v}
    )
    settings_dict = setup_django(DB_NAME, fresh=args.fresh, memory_app=app_settings(mode))
    from django.db import connection

    from bench import search_bench as this
    from memory_app.conf import memory_settings

    world = World()
    load(mode, settings_dict, world)
    index, build_seconds = build_index(mode, rebuild=args.rebuild)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_size_pretty(pg_relation_size(c.oid)), c.reloptions FROM pg_class c "
            "WHERE c.oid = %s::regclass",
            [index],
        )
        index_size, reloptions = cursor.fetchone()
    # What the index was built with (a reused index may predate a change of settings).
    index_options = ", ".join(f"`{o.replace('=', ' = ')}`" for o in reloptions or [])

    qs = queries(mode, world)
    this.QUERY_VECTORS.update({text: v.tolist() for _, text, v in qs})
    mems = sessions_by_owner(mode)
    log("exact answers")
    truth = {text: exact(mode, mems[o].session.owner_id, vector) for o, text, vector in qs}
    exact_lat = exact_latency(mode, mems, qs)
    rows = []
    for force in (False, True):
        for ef in EF_SEARCH_VALUES:
            log(f"searching, ef_search={ef}{', HNSW forced' if force else ''}")
            rows.append(measure(mode, mems, qs, truth, ef, force_hnsw=force))
    log("peak RSS probe")
    rss = rss_probe(args.quick)
    with connection.cursor() as cursor:
        cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        pgvector = cursor.fetchone()[0]
        cursor.execute("SHOW server_version")
        server = cursor.fetchone()[0]

    default_ef = int(memory_settings.HNSW_EF_SEARCH)
    table = markdown_table(
        [
            "planner",
            "hnsw.ef_search",
            "plan taken",
            "recall@10 (mean)",
            "recall@10 (worst query)",
            "fewest results",
            "median (ms)",
            "p99 (ms)",
            "searches timed",
        ],
        [
            [
                "HNSW forced" if r["forced"] else "its own choice",
                f"**{r['ef_search']}** (default)"
                if r["ef_search"] == default_ef
                else str(r["ef_search"]),
                "HNSW" if r["hnsw"] else "exact (owner index + sort)",
                f"{r['recall']:.3f}",
                f"{r['min_recall']:.1f}",
                str(r["min_count"]),
                fmt_ms(r["median"]),
                fmt_ms(r["p99"]),
                str(r["n"]),
            ]
            for r in rows
        ],
    )
    default_rows = [r for r in rows if r["ef_search"] == default_ef]
    plans = {("forced" if r["forced"] else "chosen"): r["plan"] for r in default_rows}
    text = render(
        mode,
        args,
        table,
        plans,
        exact_lat,
        build_seconds,
        index_size,
        index_options,
        rss,
        pgvector,
        server,
        memory_settings,
        time.perf_counter() - started,
    )
    out = (
        Path(args.out) if args.out else RESULTS / ("search-quick.md" if args.quick else "search.md")
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    log(f"written to {out}")
    return 0


def command_flags(args) -> str:
    flags = [
        ("--quick", args.quick),
        ("--fresh", args.fresh),
        ("--rebuild", args.rebuild),
        (f"--m {args.m}", args.m),
        (f"--ef-construction {args.ef_construction}", args.ef_construction),
    ]
    return "".join(f" {flag}" for flag, given in flags if given)


def render(
    mode,
    args,
    table,
    plans,
    exact_lat,
    build_seconds,
    index_size,
    index_options,
    rss,
    pgvector,
    server,
    settings,
    elapsed,
) -> str:
    per_owner = mode.messages // OWNERS
    build = f"{build_seconds:.0f} s" if build_seconds is not None else "reused from an earlier run"
    backend = (
        f"{rss['backend_peak_rss_mb']:.0f} MiB"
        if rss.get("backend_peak_rss_mb") is not None
        else "not readable"
    )
    return f"""# Owner-scope vector search

`python bench/search_bench.py{command_flags(args)}` (PostgreSQL {server.split()[0]},
pgvector {pgvector}, 2 CPU cores shared with other work; {elapsed / 60:.1f} minutes).

{mode.messages:,} messages with {DIMS}-dimension vectors, {OWNERS} owners of
{mode.sessions_per_owner} sessions each ({per_owner:,} vectors per owner, 5% of the index);
vectors clustered around {TOPICS} shared topic centres, each owner using {TOPICS_PER_OWNER}.
{mode.queries} queries, each near a topic its owner has talked about, through
`SessionMemory.search(query, limit=10, scope="owner", mode="vector")`, each timed twice (two
rounds). Recall@10 is against the exact top 10 of the same owner (same filter, ordered by the
uncast column, which no index serves).

"Its own choice" is what the planner does with the app's query. "HNSW forced" runs the same
searches with `enable_sort = off` for the session, so the planner must walk the HNSW index (as
it will for an owner with many more vectors): the figures of the index path itself.

{table}

- HNSW index: {index_options}, built by `ensure_hnsw_index()` (from the app's `HNSW_M` and
  `HNSW_EF_CONSTRUCTION` settings) in {build}, {index_size}
  (the benchmark raises `maintenance_work_mem` to 1 GB for its build session, so that the
  graph is built in memory; with PostgreSQL's 64 MB default it spills and takes far longer).
- Iterative scan: `relaxed_order`, `hnsw.max_scan_tuples = {settings.HNSW_MAX_SCAN_TUPLES}`;
  "fewest results" is the smallest number of results any search returned (10 = always full).
- The exact query alone (no adapter): median {fmt_ms(exact_lat.median)} ms, p99
  {fmt_ms(exact_lat.p99)} ms ({exact_lat.count} queries).
- Peak RSS of a fresh process running the {mode.queries} searches: {rss["peak_rss_mb"]:.0f} MiB;
  of its server backend: {backend}.

Plan of one search at the default `ef_search`, as the planner chooses:

```
{plans.get("chosen", "")}
```

and with the HNSW index forced:

```
{plans.get("forced", "")}
```
"""


if __name__ == "__main__":
    sys.exit(main())
