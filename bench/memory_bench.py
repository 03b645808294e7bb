"""Learned memory on the LoCoMo conversations: recall of the evidence with memories included,
stale facts returned for changed facts, and what extraction costs.

    .venv/bin/python bench/memory_bench.py                 # writes bench/results/memory.md

Each conversation is stored as one session of its own owner (one message per turn, both
speakers' turns as the user's and the assistant's, as bench/locomo_recall.py stores them), with
the default settings: the keyword importance scorer flags the turns that state lasting facts.

1. **Offline extraction** (``OfflineExtractor``, both roles: both speakers are people) reads
   every session; turns per second are measured over the whole run (embedding the facts and the
   duplicate checks included). No parameter is tuned here: ``MEMORY_DUPLICATE_SIMILARITY`` keeps
   its default (0.9), chosen before this benchmark ran.
2. **Recall of the evidence** for the questions of categories 1-4: the turns named as
   ``evidence`` among what recall returns, with memories included (a memory counts as the turns
   it came from), against messages alone: 10 messages; 5 messages and 5 memories (the same
   number of items, as ``context(recall_k=5, memories=5)`` gives); 10 messages and 5 memories.
3. **Stale facts**: LoCoMo annotates each session's events per speaker (``events_session_N``).
   A *changed fact* is an event restated in a later session by the same speaker (at least 40% of
   its content words shared, not the same sentence); the earlier one is then stale. The events
   are kept in date order as the speaker's memories, and each later event is searched for (top
   3): stale is an earlier event returned while its later form is in force. Once as the offline
   extractor keeps them (each event a new fact: it never updates one), once with each later
   event written as an update of the earlier (what ``OpenAIExtractor``'s ``update`` operation
   does when a model recognises the change; whether a model recognises it is not measured
   here: no model is reachable from this machine).
4. **Extraction through an OpenAI-compatible model**: ``OpenAIExtractor`` against a local
   OpenAI-compatible server that answers at once (the test suite's), over one conversation in
   batches of ``MEMORY_EXTRACT_BATCH`` (10): calls and our own seconds per 100 turns (a real
   model adds its latency to each call).

Runs against the project's PostgreSQL (``DATABASE_URL``, or the embedded server), in a
database of its own (``bench_memory``, made anew each run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench.common import RESULTS, markdown_table, setup_django  # noqa: E402
from bench.locomo_recall import load_conversation  # noqa: E402

OFFLINE = "memory_app.providers.extractors.OfflineExtractor"
OPENAI = "memory_app.providers.extractors.OpenAIExtractor"
WORD = re.compile(r"[a-z']+")
STOP = frozenset(
    "a an and are as at be by for from has have her his in is it its of on or she he the their "
    "them they this to was were with about after again also".split()
)


def content_words(text: str) -> set[str]:
    return {w for w in WORD.findall(text.lower()) if w not in STOP and len(w) > 2}


def changed_facts(path: Path) -> list[tuple[str, str, int, str, int]]:
    """``(speaker, earlier event, its session, later event, its session)`` of one
    conversation."""
    data = json.loads(path.read_text())
    conversation = data.get("conversation", data)
    events = []  # (session number, date, speaker, text)
    for key, value in data.items() if "events_session_1" in data else conversation.items():
        match = re.fullmatch(r"events_session_(\d+)", key)
        if not match or not isinstance(value, dict):
            continue
        for speaker, texts in value.items():
            if speaker == "date":
                continue
            for text in texts or ():
                events.append((int(match.group(1)), value.get("date", ""), speaker, text))
    events.sort()
    pairs = []
    for i, (n1, _d1, s1, t1) in enumerate(events):
        w1 = content_words(t1)
        for n2, _d2, s2, t2 in events[i + 1 :]:
            if s2 != s1 or n2 <= n1 or not w1:
                continue
            w2 = content_words(t2)
            overlap = len(w1 & w2) / len(w1 | w2)
            if 0.4 <= overlap < 0.9:
                pairs.append((s1, t1, n1, t2, n2))
    return pairs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT / "bench" / "data" / "locomo")
    parser.add_argument("--out", type=Path, default=RESULTS / "memory.md")
    args = parser.parse_args()
    files = sorted(args.data.glob("*.json"))
    setup_django("bench_memory", fresh=True)

    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test.utils import override_settings

    from memory_app import Memory
    from memory_app.providers.embeddings import get_embedder

    embedder = get_embedder().name
    loaded = [load_conversation(path) for path in files]
    User = get_user_model()
    sessions = []
    t0 = time.perf_counter()
    with override_settings(MEMORY_APP={"EMBED_ON_APPEND": False, "AFTER_APPEND": "immediate"}):
        for sample, turns, questions in loaded:
            owner = User.objects.create(username=f"locomo-{sample}-{uuid.uuid4().hex[:6]}")
            mem = Memory.create(str(sample), owner=owner, namespace="locomo")
            for start in range(0, len(turns), 500):
                mem.add_many(turns[start : start + 500])
            mem.embed()
            by_cursor = {m.cursor: m.metadata["dia_id"] for m in mem.messages()}
            sessions.append((sample, mem, questions, by_cursor))
    n_turns = sum(len(t) for _, t, _ in loaded)
    remembered = sum(m.remember for _, mem, _, _ in sessions for m in mem.messages())
    print(
        f"stored and embedded {n_turns} turns in {time.perf_counter() - t0:.1f}s", file=sys.stderr
    )

    # 1. offline extraction
    offline = {
        "MEMORY_EXTRACTOR": OFFLINE,
        "MEMORY_EXTRACTOR_OPTIONS": {"roles": ["user", "assistant"]},
        "SUMMARIZE_THRESHOLD_TOKENS": None,
    }
    t0 = time.perf_counter()
    totals = {"added": 0, "confirmed": 0, "read": 0}
    with override_settings(MEMORY_APP=offline):
        for _, mem, _, _ in sessions:
            done = mem.extract_memories()
            for key in totals:
                totals[key] += done[key]
    offline_seconds = time.perf_counter() - t0
    print(f"offline extraction: {totals} in {offline_seconds:.1f}s", file=sys.stderr)

    # 2. recall of the evidence
    variants = {
        "10 messages": (10, 0),
        "5 messages + 5 memories": (5, 5),
        "10 messages + 5 memories": (10, 5),
    }
    recall = {name: [] for name in variants}
    hit = {name: [] for name in variants}
    for _, mem, questions, by_cursor in sessions:
        for q in questions:
            messages = [by_cursor.get(r.cursor) for r in mem.search(q["question"], 10)]
            facts = mem.learned.search(q["question"], limit=5)
            fact_turns = [by_cursor.get(c) for f in facts for c in f.source_cursors]
            for name, (k_messages, k_memories) in variants.items():
                got = set(messages[:k_messages]) | (set(fact_turns) if k_memories else set())
                found = len(q["evidence"] & got)
                recall[name].append(found / len(q["evidence"]))
                hit[name].append(1.0 if found else 0.0)

    # 3. stale facts: each conversation's changed events, kept in date order as one speaker's
    # facts would be; a chain (A changed to B, B to C) stays one memory with updates.
    probes = {path.stem: changed_facts(path) for path in files}
    stale = {"offline: each event a new fact": [], "changed events written as updates": []}
    as_of_right = []
    for sample, pairs in probes.items():
        if not pairs:
            continue
        when: dict[str, int] = {}
        for _speaker, earlier, n1, later, n2 in pairs:
            when.setdefault(earlier, n1)
            when.setdefault(later, n2)
        stream = sorted(when, key=lambda text: when[text])  # distinct events in session order
        changed_from = {}
        for _speaker, earlier, _d1, later, _d2 in pairs:
            changed_from.setdefault(later, earlier)
        for how in stale:
            owner = User.objects.create(username=f"events-{sample}-{uuid.uuid4().hex[:6]}")
            learned = Memory.learned(owner)
            key_of: dict[str, str] = {}
            for text in stream:
                earlier = changed_from.get(text)
                if how.startswith("offline") or earlier not in key_of:
                    key_of[text] = learned.remember(text, importance=0.5).key
                    continue
                before = learned.current(limit=1000)
                mark = max(m.valid_from for m in before)
                key = key_of[earlier]
                previous = next(m.text for m in before if m.key == key)
                learned.update(key, text)
                key_of[text] = key
                old_texts = [m.text for m in learned.current(as_of=mark, limit=1000)]
                as_of_right.append(1.0 if previous in old_texts else 0.0)
            for _speaker, earlier, _d1, later, _d2 in pairs:
                top = [m.text for m in learned.search(later, limit=3)]
                stale[how].append(1.0 if earlier in top else 0.0)

    laters = Counter(later for pairs in probes.values() for _s, _e, _n1, later, _n2 in pairs)
    multi = sum(n for n in laters.values() if n > 1)

    # 4. extraction through a model
    from tests.openai_server import FakeOpenAIServer

    server = FakeOpenAIServer().start()
    server.chat_handler = lambda request: json.dumps({"operations": []})
    sample, mem, _, _ = sessions[0]
    turns = len(mem.messages())
    from memory_app.models import Session

    Session.objects.filter(pk=mem.id).update(extracted_upto=0)
    model = {
        "MEMORY_EXTRACTOR": OPENAI,
        "MEMORY_EXTRACT_MAX_MESSAGES": 10,
        "OPENAI": {"base_url": server.base_url, "api_key": "bench", "max_retries": 0},
        "SUMMARIZE_THRESHOLD_TOKENS": None,
    }
    with override_settings(MEMORY_APP=model):
        t0 = time.perf_counter()
        done = mem.extract_memories()
        model_seconds = time.perf_counter() - t0
    calls = len(server.requests_to("/chat/completions"))
    server.stop()

    with connection.cursor() as cursor:
        cursor.execute("SELECT version()")
        pg = cursor.fetchone()[0].split(" on ")[0]
    load = os.getloadavg()[0]
    n_questions = len(recall["10 messages"])

    def mean(values):
        return statistics.fmean(values) if values else 0.0

    lines = [
        "# Learned memory on LoCoMo",
        "",
        f"`.venv/bin/python bench/memory_bench.py`; {len(sessions)} conversations, {n_turns} turns "
        f"({remembered} flagged to remember by the keyword scorer), {n_questions} questions "
        f"(categories 1-4); embedder `{embedder}`; {pg}; load average {load:.2f} at the end. "
        "No parameter was tuned on these conversations.",
        "",
        "## Offline extraction",
        "",
        markdown_table(
            [
                "turns read",
                "facts kept",
                "found again (confirmed, not stored twice)",
                "seconds",
                "turns/s",
            ],
            [
                [
                    str(totals["read"]),
                    str(totals["added"]),
                    str(totals["confirmed"]),
                    f"{offline_seconds:.1f}",
                    f"{totals['read'] / offline_seconds:,.0f}",
                ]
            ],
        ),
        "",
        "## Recall of the evidence (hybrid search, session scope)",
        "",
        markdown_table(
            ["what recall returns", "recall of the evidence", "questions with some evidence"],
            [[name, f"{mean(recall[name]):.3f}", f"{mean(hit[name]):.3f}"] for name in variants],
        ),
        "",
        "## Stale facts for changed facts",
        "",
        f"{sum(len(p) for p in probes.values())} changed facts found in the events of "
        f"{sum(1 for p in probes.values() if p)} conversations (a later event of the same speaker "
        "sharing at least 40% of an earlier one's content words). Stale: the earlier form among "
        "the top 3 memories when the later one is searched for.",
        "",
        markdown_table(
            ["how the later fact was kept", "stale facts returned"],
            [[how, f"{mean(values):.1%}"] for how, values in stale.items()],
        ),
        "",
        f"Written as updates, a later event that restates several earlier ones ({multi} of the "
        "changed facts) updates one of them; the others stay in force, which is what is left of "
        "stale facts there. As of just before each update, the version it superseded was in "
        f"force in {mean(as_of_right):.0%} of the cases (`current(as_of=...)`).",
        "",
        "## Extraction through an OpenAI-compatible model",
        "",
        f"{turns} turns of conversation {sample} in batches of 10 against a local server that "
        "answers at once (our own cost; a real model adds its latency per call):",
        "",
        markdown_table(
            ["calls", "calls per 100 turns", "seconds per 100 turns (ours)", "batches"],
            [
                [
                    str(calls),
                    f"{100 * calls / turns:.1f}",
                    f"{100 * model_seconds / turns:.3f}",
                    str(done["batches"]),
                ]
            ],
        ),
        "",
    ]
    report = "\n".join(lines)
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
