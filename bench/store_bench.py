"""Store benchmark: this app's adapter side by side with the alternatives and the floor.

    python bench/store_bench.py --quick      # about six minutes
    python bench/store_bench.py              # the full run
    python bench/store_bench.py --quick --cpus apart  # this process and the server pinned apart

Everything is measured in one run, on one PostgreSQL server (the project's: ``DATABASE_URL``
or the embedded one), in a separate database (``bench``), with the same messages for every
store. Latencies are medians (and p99) of single calls; the stores take turns, ten calls at
a time, so that load from elsewhere on the machine hits them alike. Figures are given as ratios to the
floor, raw psycopg with one prepared statement per operation (1.00x = what the database
itself costs; higher is slower). The table is printed and written to
``bench/results/store.md``.

The read sessions (1,000 and 100,000 messages per store) are kept between runs and reused
when complete (``--fresh`` drops the database first).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import inspect
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``bench`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "bench"

from bench.common import (  # noqa: E402
    RESULTS,
    ROOT,
    Latency,
    add_cpus_argument,
    cpu_placement,
    cpus_option,
    current_rss_mb,
    fmt_ms,
    fmt_rate,
    fmt_ratio,
    markdown_table,
    peak_rss_mb,
    results_suffix,
    setup_django,
)

DATA_VERSION = 1
MAX_TOKENS = 8000
WRITERS = 16
# The store alone: no summarization or embedding triggered by appends (without a broker they
# would run inline; with one they are an enqueue after commit, measured by their own benches).
STORE_ONLY = {
    "SUMMARIZE_THRESHOLD_TOKENS": None,
    "EMBED_ON_APPEND": False,
    "IMPORTANCE_THRESHOLD": None,
    "MEMORY_EXTRACTOR": None,  # the app's default (the demo project turns it on)
}

WORDS = (
    "the agent asked about shipping times for order numbers and the customer replied that "
    "delivery to Oslo took longer than expected because of weather so we checked the tracking "
    "page again later today while reviewing invoices refunds warranty terms product manuals "
    "configuration steps error messages logs screenshots and a summary of previous tickets "
    "please confirm whether the replacement part fits model seven or eight thanks"
).split()


@dataclass
class Mode:
    name: str
    small: int = 1_000
    big: int = 100_000
    single: int = 300
    batches: int = 15
    reads: int = 150
    windows: int = 100
    per_writer: int = 100
    conc_rounds: int = 3
    max_seconds: float = 4.0


MODES = {
    "quick": Mode("quick"),
    "full": Mode(
        "full",
        single=2000,
        batches=100,
        reads=1000,
        windows=500,
        per_writer=200,
        conc_rounds=5,
        max_seconds=20.0,
    ),
}


def make_messages(
    count: int,
    seed: int,
    *,
    system: bool = True,
    words: int | None = None,
    text: str = "bench",
) -> list[dict]:
    """``count`` chat messages, the same for a given seed: a system prompt, then user and
    assistant turns of varied length (about 60 tokens on average), or of ``words`` words each.

    ``text="bench"`` draws words from a small support-chat vocabulary; ``"conversation"``
    takes them in order from real conversations (the LoCoMo turns in ``bench/data/locomo``),
    whose everyday phrases ("I love", "always", "my son") the importance scorer looks for."""
    rng = random.Random(seed)
    source = _conversation_words() if text == "conversation" else None
    messages = []
    if system:
        messages.append({"role": "system", "content": "You are a helpful support agent. Be brief."})
    while len(messages) < count:
        role = "user" if len(messages) % 2 else "assistant"
        length = words or (rng.randint(4, 50) if role == "user" else rng.randint(20, 120))
        if source is None:
            content = " ".join(rng.choice(WORDS) for _ in range(length))
        else:
            start = rng.randrange(len(source) - length)
            content = " ".join(source[start : start + length])
        messages.append({"role": role, "content": content})
    return messages[:count]


@functools.cache
def _conversation_words() -> list[str]:
    words: list[str] = []
    for path in sorted((ROOT / "bench" / "data" / "locomo").glob("*.json")):
        data = json.loads(path.read_text())
        conversation = data.get("conversation", data)
        for key, turns in conversation.items():
            if key.startswith("session_") and isinstance(turns, list):
                for turn in turns:
                    words.extend(turn["text"].split())
    return words


def with_tokens(messages: list[dict]) -> list[dict]:
    """Adds ``_tokens`` (what the floor stores; ours counts its own on append)."""
    from memory_app.tokens import count_message

    for m in messages:
        if "_tokens" not in m:
            m["_tokens"] = count_message({"role": m["role"], "content": m["content"]})
    return messages


def resolve(store, value):
    """Runs an async store's coroutine; passes other values through."""
    return store.run(value) if inspect.isawaitable(value) else value


@dataclass
class Results:
    cells: dict = field(default_factory=dict)  # (workload, store) -> value
    notes: dict = field(default_factory=dict)

    def put(self, workload, store, value):
        self.cells[(workload, store)] = value
        # The 1-minute load average when the workload's first figure came in (its measurement
        # just ended), printed beside its row.
        self.notes.setdefault("loads", {}).setdefault(workload, os.getloadavg()[0])

    def get(self, workload, store):
        return self.cells.get((workload, store))


def interleaved(
    stores, make_fn, *, count: int, max_seconds: float, turn: int = 10
) -> dict[str, Latency]:
    """Each store makes ``count`` timed calls of ``make_fn(store)`` (fewer if it spends its
    ``max_seconds``), ``turn`` calls at a time, the stores taking turns in rotating order, so
    that load from elsewhere on the machine falls on all of them alike."""
    fns = {s.name: make_fn(s) for s in stores}
    samples: dict[str, list[float]] = {s.name: [] for s in stores}
    spent = dict.fromkeys(samples, 0.0)
    for store in stores:
        store.measure(fns[store.name], count=0, max_seconds=0)  # warm-up only
    for r in range(10**9):
        active = [
            s
            for s in stores
            if len(samples[s.name]) < count
            and (spent[s.name] < max_seconds or len(samples[s.name]) < 1)
        ]
        if not active:
            break
        shift = r % len(active)
        for store in active[shift:] + active[:shift]:
            began = time.perf_counter()
            done = samples[store.name]
            calls = 1 if done and done[-1] > 0.1 else turn  # slow calls: one per turn
            latency = store.measure(
                fns[store.name],
                count=min(calls, count - len(done)),
                max_seconds=float("inf"),
                warmup=0,
            )
            spent[store.name] += time.perf_counter() - began
            samples[store.name] += latency.samples
    return {name: Latency(s) for name, s in samples.items()}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(mode: Mode, stores, results: Results, settings_dict) -> None:
    run_id = uuid.uuid4().hex[:8]

    single_appends(stores, results, run_id, count=mode.single, max_seconds=mode.max_seconds * 3)
    summarize_check(stores, results, run_id, count=mode.single)

    # -- batches of 100 ---------------------------------------------------------------------------
    log("batch appends")
    batch = with_tokens(make_messages(100, seed=11, system=False))
    sessions = {}
    for s in stores:
        sessions[s.name] = s.session(f"batch-{run_id}-{s.name}")

    def batched(store):
        session = sessions[store.name]
        return lambda: store.append_batch(session, batch)

    for name, lat in interleaved(
        stores, batched, count=mode.batches, max_seconds=mode.max_seconds * 3
    ).items():
        results.put("batch_rate", name, 100 * lat.count / sum(lat.samples))

    # -- reads on a small and a big session ---------------------------------------------------------
    writers_only = stores
    stores = [s for s in stores if not getattr(s, "appends_only", False)]
    for size in (mode.small, mode.big):
        log(f"reads on sessions of {size:,} messages (loading what is missing)")
        data = None
        read_sessions = {}
        for s in stores:
            session = s.session(f"read-{size}-v{DATA_VERSION}")
            have = resolve(s, s.count(session))
            if have != size:
                if have:
                    raise SystemExit(
                        f"{s.name}: read session of {size} holds {have} messages; run with --fresh"
                    )
                data = data or with_tokens(make_messages(size, seed=size))
                began = time.perf_counter()
                s.load(session, data)
                log(f"  loaded {size:,} into {s.name} in {time.perf_counter() - began:.1f}s")
            read_sessions[s.name] = session
        if data is not None:
            vacuum_analyze(settings_dict)  # settle plans and visibility after the bulk load

        def last50(store, read_sessions=read_sessions):
            session = read_sessions[store.name]
            return lambda: store.last(session, 50)

        def window(store, read_sessions=read_sessions):
            session = read_sessions[store.name]
            return lambda: store.window(session, MAX_TOKENS)

        for label, make_fn, count in (
            ("last", last50, mode.reads),
            ("window", window, mode.windows),
        ):
            for name, lat in interleaved(
                stores, make_fn, count=count, max_seconds=mode.max_seconds
            ).items():
                results.put(f"{label}_{size}", name, lat.median)
                results.put(f"{label}_{size}_p99", name, lat.p99)
                results.notes.setdefault("samples", {})[f"{label}_{size}/{name}"] = lat.count
        # What each store's window holds (same data, same budget): a sanity check.
        for s in stores:
            got = resolve(s, s.window(read_sessions[s.name], MAX_TOKENS))
            results.notes.setdefault("window_sizes", {})[f"{s.name}@{size}"] = len(got)

    for shared in (True, False):
        concurrent(
            writers_only,
            results,
            run_id,
            shared=shared,
            per_writer=mode.per_writer,
            rounds=mode.conc_rounds,
        )


def single_appends(
    stores, results: Results, run_id: str, *, count: int, max_seconds: float, suffix: str = ""
) -> None:
    log(f"single appends{suffix.replace('_', ', ')}")
    pool = with_tokens(make_messages(512, seed=7, system=False))
    sessions = {}
    for s in stores:
        sessions[s.name] = s.session(f"append{suffix}-{run_id}-{s.name}")

    def single(store):
        counter = iter(range(10**9))
        session = sessions[store.name]
        return lambda: store.append(session, pool[next(counter) % len(pool)])

    for name, lat in interleaved(stores, single, count=count, max_seconds=max_seconds).items():
        results.put(f"append_median{suffix}", name, lat.median)
        results.put(f"append_p99{suffix}", name, lat.p99)
        results.notes.setdefault("samples", {})[f"append{suffix}/{name}"] = lat.count


def summarize_check(stores, results: Results, run_id: str, *, count: int) -> None:
    """Ours with the after-append summarization trigger on (the default), its threshold out of
    reach: what the check itself adds to an append."""
    from django.test.utils import override_settings

    from bench.stores import OursStore

    ours = next((s for s in stores if isinstance(s, OursStore) and s.name == "ours"), None)
    if ours is None:
        return
    log("single appends with the summarize trigger")
    pool = make_messages(512, seed=7, system=False)
    session = ours.session(f"append-trigger-{run_id}")
    counter = iter(range(10**9))
    with override_settings(MEMORY_APP={**STORE_ONLY, "SUMMARIZE_THRESHOLD_TOKENS": 10**12}):
        latency = ours.measure(
            lambda: ours.append(session, pool[next(counter) % len(pool)]),
            count=count,
            max_seconds=30,
        )
    results.put("append_trigger", ours.name, latency.median)


def concurrent(
    stores,
    results: Results,
    run_id: str,
    *,
    shared: bool,
    per_writer: int,
    rounds: int,
    suffix: str = "",
) -> None:
    """16 writers on one session (``shared``) or on 16: throughput, the median of ``rounds``
    rounds (the stores take turns, in a rotating order), and a check after every round that
    nothing was lost or doubled and, for ours, that cursors are exactly 1..N in every session.

    Each turn starts from a collected heap (``gc.collect()``), so that a full collection of
    what earlier stages left behind does not land in one store's fraction of a second. What of
    ours' after-append work is still waiting when its last append returns is finished before the
    next turn, outside the time, so that it does not fall on the next store's turn.
    """
    from bench.stores import OursStore, concurrent_writes
    from memory_app.services import background

    label = "one" if shared else "many"
    log(
        f"{WRITERS} concurrent writers, {'one session' if shared else f'{WRITERS} sessions'}"
        f"{suffix.replace('_', ', ')}: {rounds} rounds of {per_writer} appends per writer"
    )
    writers = [s for s in stores if s.name != "ours_default"]  # options do not change locking
    rates: dict[str, list[float]] = {s.name: [] for s in writers}
    lost = dict.fromkeys(rates, 0)
    extra = dict.fromkeys(rates, 0)
    cursors_ok = dict.fromkeys(rates, True)
    for round_no in range(rounds):
        shift = round_no % len(writers)
        for s in writers[shift:] + writers[:shift]:
            prefix = f"conc{suffix}-{run_id}-r{round_no}-{s.name}"
            keys = [prefix] * WRITERS if shared else [f"{prefix}-{i}" for i in range(WRITERS)]
            for key in set(keys):
                resolve(s, s.count(s.session(key)))  # create the sessions before the start

            def message(i, j, _prefix=prefix):
                return {
                    "role": "user",
                    "content": f"writer {i} message {j} {_prefix}",
                    "_tokens": 12,
                }

            gc.collect()
            with s.configured() if isinstance(s, OursStore) else contextlib.nullcontext():
                elapsed = concurrent_writes(s, keys, per_writer, message)
            if isinstance(s, OursStore):
                background.wait_for_deferred()  # its after-append work, before the next turn
            rates[s.name].append(WRITERS * per_writer / elapsed)
            expected = Counter(
                message(i, j)["content"] for i in range(WRITERS) for j in range(per_writer)
            )
            found: Counter = Counter()
            for key in set(keys):
                found.update(s.stored_contents(key))
                if isinstance(s, OursStore):
                    cursors = s.cursors(key)
                    cursors_ok[s.name] &= cursors == list(range(1, len(cursors) + 1))
            lost[s.name] += sum((expected - found).values())
            extra[s.name] += sum((found - expected).values())
    for s in writers:
        results.put(f"conc_{label}{suffix}", s.name, statistics.median(rates[s.name]))
        results.notes.setdefault("conc_rounds", {})[f"conc_{label}{suffix}/{s.name}"] = rates[
            s.name
        ]
        results.put(
            f"conc_{label}{suffix}_check",
            s.name,
            (lost[s.name], extra[s.name], cursors_ok[s.name] if isinstance(s, OursStore) else None),
        )


def run_durable(mode: Mode, stores, results: Results) -> None:
    """Appends again with PostgreSQL's default durable commit (each waits for its WAL flush)."""
    run_id = uuid.uuid4().hex[:8]
    single_appends(
        stores,
        results,
        run_id,
        count=mode.single // 3,
        max_seconds=mode.max_seconds * 2,
        suffix="_durable",
    )
    concurrent(
        stores,
        results,
        run_id,
        shared=True,
        per_writer=mode.per_writer,
        rounds=mode.conc_rounds,
        suffix="_durable",
    )


def vacuum_analyze(settings_dict) -> None:
    import psycopg

    from bench.common import libpq_params

    with psycopg.connect(**libpq_params(settings_dict), autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def rss_probe(store_name: str, big: int) -> tuple[float, float]:
    """Peak RSS of a fresh process that opens ``store_name`` and builds the token window of its
    big read session five times, and how much of it those reads added."""
    env = dict(os.environ)
    out = subprocess.run(
        [sys.executable, __file__, "--rss-probe", store_name, "--big", str(big)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    return figures["peak_rss_mb"], figures["peak_rss_mb"] - figures["before_mb"]


def probe_main(store_name: str, big: int) -> None:
    settings_dict = setup_django(memory_app=STORE_ONLY)
    store = build_stores([store_name])[0]
    store.setup(settings_dict)
    session = store.session(f"read-{big}-v{DATA_VERSION}")
    resolve(store, store.last(session, 1))  # connected, tables known
    before = current_rss_mb()
    for _ in range(5):
        resolve(store, store.window(session, MAX_TOKENS))
    print(json.dumps({"peak_rss_mb": peak_rss_mb(), "before_mb": before}))


def build_stores(names, *, durable: bool = False):
    from bench.stores import AgentsStore, LangchainStore, OursStore, RawStore

    every = {
        "raw": RawStore,
        "ours": lambda: OursStore(prepared=True),
        "ours_default": lambda: OursStore(prepared=False),
        "ours_production": lambda: OursStore(prepared=True, config="production"),
        "ours_demo": lambda: OursStore(prepared=True, config="demo"),
        "langchain": LangchainStore,
        "agents": AgentsStore,
    }
    stores = [every[n]() for n in names]
    for store in stores:
        store.durable = durable
    return stores


ROWS = [
    ("append_median", "single append, median (ms)", "ms"),
    ("append_p99", "single append, p99 (ms)", "ms"),
    ("append_trigger", "single append with the summarize trigger on, median (ms)", "ms"),
    ("batch_rate", "batch of 100 (messages/s)", "rate"),
    ("last_{small}", "last(50), {small:,} messages (ms)", "ms"),
    ("last_{big}", "last(50), {big:,} messages (ms)", "ms"),
    ("window_{small}", "window 8k tokens, {small:,} messages (ms)", "ms"),
    ("window_{big}", "window 8k tokens, {big:,} messages (ms)", "ms"),
    ("conc_one", "16 writers, one session (messages/s)", "rate"),
    ("conc_many", "16 writers, 16 sessions (messages/s)", "rate"),
    ("append_median_durable", "single append, durable commit, median (ms)", "ms"),
    ("append_p99_durable", "single append, durable commit, p99 (ms)", "ms"),
    ("conc_one_durable", "16 writers, one session, durable commit (messages/s)", "rate"),
    ("rss", "peak RSS of a process building the big session's window (MiB; reads added)", "mb"),
]


def render(mode: Mode, stores, results: Results, elapsed: float) -> str:
    header = ["workload"] + [s.title for s in stores] + ["load average"]
    loads = results.notes.get("loads", {})
    rows = []
    for key, label, kind in ROWS:
        key = key.format(small=mode.small, big=mode.big)
        floor = results.get(key, "raw") or results.get(key.replace("_trigger", "_median"), "raw")
        row = [label.format(small=mode.small, big=mode.big)]
        for s in stores:
            value = results.get(key, s.name)
            if value is None:
                row.append("–")
                continue
            if kind == "ms":
                cell = f"{fmt_ms(value)} ({fmt_ratio(value / floor)})"
            elif kind == "rate":
                cell = f"{fmt_rate(value)} ({fmt_ratio(floor / value)})"
            else:
                peak, added = value
                cell = f"{peak:.0f} (+{added:.0f})"
            check = results.get(f"{key}_check", s.name)
            if check is not None:
                lost, extra, cursors_ok = check
                cell += f"; lost {lost}" + (f", doubled {extra}" if extra else "")
                if cursors_ok is not None:
                    cell += ", cursors 1..N" if cursors_ok else ", CURSOR GAPS"
            row.append(cell)
        load = loads.get(key)
        row.append("–" if load is None else f"{load:.1f}")
        rows.append(row)
    ratio_note = (
        "Ratios are to the floor (raw psycopg, one prepared statement): time / floor "
        "time, or floor rate / rate; 1.00x is the floor, higher is slower."
    )
    small, big = mode.small, mode.big
    against = []
    for key, label, kind in (
        ("append_median", "single append", "ms"),
        ("batch_rate", "batch of 100", "rate"),
        ("conc_one", "16 writers on one session", "rate"),
        ("conc_many", "16 writers on 16 sessions", "rate"),
        ("append_median_durable", "single append, durable", "ms"),
    ):
        lc = results.get(key, "langchain")
        cells = []
        for name in ("ours", "ours_production"):
            value = results.get(key, name)
            if lc and value:
                ratio = value / lc if kind == "ms" else lc / value
                cells.append(f"{name} {ratio:.2f}x")
        store, demo = results.get(key, "ours"), results.get(key, "ours_demo")
        if store and demo:
            cells.append(
                f"ours_demo {demo / store if kind == 'ms' else store / demo:.2f}x the store alone"
            )
        if cells:
            against.append(f"{label}: " + ", ".join(cells))
    independence = []
    for s in stores:
        a, b = results.get(f"window_{small}", s.name), results.get(f"window_{big}", s.name)
        c, d = results.get(f"last_{small}", s.name), results.get(f"last_{big}", s.name)
        if a and b and c and d:
            independence.append(f"{s.name}: last {d / c:.2f}x, window {b / a:.2f}x")
    sizes = results.notes.get("window_sizes", {})
    lines = [
        f"# Store benchmark ({mode.name} mode)",
        "",
        markdown_table(header, rows),
        "",
        ratio_note,
        "",
        "Against langchain-postgres (its time or rate = 1.00x; lower is faster): "
        + "; ".join(against)
        + ".",
        "",
        f"- Read cost on {big:,} vs {small:,} messages (1.00x = independent of session length): "
        + "; ".join(independence)
        + ".",
        f"- Messages in the 8k-token window ({big:,}-message session): "
        + ", ".join(f"{k.split('@')[0]} {v}" for k, v in sizes.items() if k.endswith(f"@{big}"))
        + ".",
        "- Windows: memory_app builds them itself (system prompt kept, tool groups whole, token "
        "counts cached at append). The floor reads the newest rows its average message size "
        "says will fit and cuts with stored counts. langchain-postgres can only read a whole "
        "session, so its last(50) and window read every message; the Agents SDK reads the newest "
        "N items (N doubling from 128 until the budget is full). Both count tokens client-side "
        "with the same tokenizer (o200k_base).",
        "- Commits: every store commits once per append. The benchmark database runs with "
        "`synchronous_commit=off` so that the figures show what each store costs, not the "
        "disk's fsync latency (which on this shared machine swung between 0.2 and 4 ms from "
        "minute to minute); the *durable commit* rows repeat appends with PostgreSQL's default, "
        "where each commit waits for its WAL flush.",
        "- The store alone (`memory_app (prepare_threshold=5)`): no broker, "
        "`EMBED_ON_APPEND=False`, `SUMMARIZE_THRESHOLD_TOKENS=None`, `IMPORTANCE_THRESHOLD=None`; "
        "each append still leaves its full-text indexing to the after-append job (this process's "
        "background thread). The *summarize trigger* row sets a threshold out of reach. "
        "*Production path*: the default `MEMORY_APP` with a Redis broker configured and no "
        "worker running: each append also scores importance and schedules its after-append job "
        "(one Redis `SET NX`; one task per session while one is queued). *No broker*: the "
        "default `MEMORY_APP` without a broker, as the demo runs: the job (full text, MiniLM "
        "vectors where installed, the summarize check) runs in a background thread; the "
        "benchmark waits for it after each turn, outside the timed calls.",
        "- Appends: memory_app validates each message, counts its tokens and hands out gapless "
        "cursors with the session's counters in the same statement; the floor inserts into a "
        "table with no session row and no constraints beyond its keys.",
        "- Concurrency: 16 threads, each with its own connection (the Agents SDK: 16 asyncio "
        f"tasks on one engine), {mode.per_writer} single appends each; the median of "
        f"{mode.conc_rounds} rounds, the stores taking turns in a rotating order, each turn "
        "after a `gc.collect()`; memory_app's after-append work still waiting at the end of "
        "its turn is finished before the next turn, outside the time. After every round each "
        "message is looked for (lost / doubled) and memory_app's cursors are checked to be "
        "exactly 1..N in every session. Rounds (messages/s): "
        + "; ".join(
            f"{key.replace('/', ' ')} " + ", ".join(f"{r:,.0f}" for r in rates)
            for key, rates in results.notes.get("conc_rounds", {}).items()
        )
        + ".",
        "- Load average: the 1-minute figure when the row's measurement ended (2 cores).",
        "- memory_app (Django defaults): Django binds parameters client-side and never prepares "
        "statements (for connection poolers); memory_app binds its hot statements server-side "
        "anyway. `DATABASES[...]['OPTIONS']['prepare_threshold'] = 5` lets PostgreSQL reuse "
        "their plans. The peers' drivers prepare by default (psycopg after 5 runs, asyncpg "
        "always).",
        f"- Peak RSS: a fresh process per store building the window of the {big:,}-message "
        f"session five times. The whole benchmark process peaked at "
        f"{results.notes.get('process_rss', 0):.0f} MiB.",
        f"- Machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, PostgreSQL {results.notes.get('server_version', '?')}, "
        f"load average at start {results.notes.get('load', '?')}; this process and the "
        f"database server {results.notes.get('placement', 'where the OS put them')}; the run "
        f"took {elapsed:.0f} s. Other work on the machine adds noise: compare ratios within one "
        "run.",
        "",
        "Reproduce: `python bench/store_bench.py"
        + (" --quick" if mode.name == "quick" else "")
        + results.notes.get("cpus_option", "")
        + "`",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller counts (about six minutes)")
    parser.add_argument("--fresh", action="store_true", help="drop and recreate the bench database")
    parser.add_argument("--big", type=int, help="size of the big read session (default 100000)")
    parser.add_argument(
        "--stores",
        default="raw,ours,ours_production,ours_demo,ours_default,langchain,agents",
        help="comma-separated subset of raw,ours,ours_production,ours_demo,ours_default,"
        "langchain,agents",
    )
    parser.add_argument(
        "--output", type=Path, help="markdown file (default bench/results/store.md)"
    )
    add_cpus_argument(parser)
    parser.add_argument("--rss-probe", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_DEBUG", "0")  # DEBUG keeps a log of every query
    mode = MODES["quick" if args.quick else "full"]
    if args.big:
        mode.big = args.big
    if args.rss_probe:
        probe_main(args.rss_probe, mode.big)
        return

    began = time.perf_counter()
    results = Results()
    results.notes["load"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    settings_dict = setup_django(fresh=args.fresh, memory_app=STORE_ONLY)
    names = args.stores.split(",")
    if "raw" not in names:
        raise SystemExit("the floor (raw) is needed for the ratios")
    with cpu_placement(settings_dict, args.cpus) as placement:
        results.notes["placement"] = placement
        results.notes["cpus_option"] = cpus_option(args.cpus)
        stores = build_stores(names)
        for store in stores:
            store.setup(settings_dict)
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SHOW server_version")
            results.notes["server_version"] = cursor.fetchone()[0].split()[0]
        try:
            run(mode, stores, results, settings_dict)
        finally:
            for store in stores:
                store.close()
        durable = build_stores(
            [n for n in names if n not in ("ours_default", "ours_demo")], durable=True
        )
        for store in durable:
            store.setup(settings_dict)
        try:
            run_durable(mode, durable, results)
        finally:
            for store in durable:
                store.close()
        results.notes["process_rss"] = peak_rss_mb()
        log("peak RSS probes")
        for store in stores:
            if not getattr(store, "appends_only", False):
                results.put("rss", store.name, rss_probe(store.name, mode.big))
    table = render(mode, stores, results, time.perf_counter() - began)
    output = args.output or RESULTS / f"store{results_suffix(cpus_option(args.cpus))}.md"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(table)
    print(table)


if __name__ == "__main__":
    main()
