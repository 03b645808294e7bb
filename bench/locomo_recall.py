"""Recall@k of memory_app's search modes on the LoCoMo long-conversation benchmark.

    python bench/locomo_recall.py                      # data in bench/data/locomo
    python bench/locomo_recall.py --data path/to/locomo --out bench/results/locomo.md
    python bench/locomo_recall.py --folds              # leave one conversation out (locomo_folds.py)
    python bench/locomo_recall.py --folds --app        # the same, measured through the app's search()

LoCoMo ("Evaluating Very Long-Term Conversational Memory of LLM Agents", Maharana et al., ACL
2024; download the data set from its authors) holds long two-person conversations and questions
whose ``evidence`` names the turns (``dia_id``) that answer them. Each conversation is stored as
one session, one message per turn (the first speaker as ``user``, the other as ``assistant``;
content ``"<speaker>: <text>"`` plus the caption of a shared photo, ``dia_id`` in the message
metadata). For every question of categories 1-4 (multi-hop, temporal, open-domain, single-hop;
5 is adversarial and has no evidence) the session is searched with the question as query:

- recall@k: the share of the question's evidence turns among the top k, averaged over questions;
- hit@k: the share of questions with at least one evidence turn in the top k.

Modes: ``lexical`` (vector search with the LexicalEmbedder), ``fulltext`` (PostgreSQL full-text),
``vector`` (all-MiniLM-L6-v2, the packaged local model), ``hybrid`` (MiniLM vector + full-text,
reciprocal rank fusion) and ``hybrid-lexical`` (lexical vector + full-text). Session scope (an
exact scan), like an agent recalling from its current conversation. The sessions are created
under a throw-away namespace and deleted at the end (``--keep`` keeps them).

Runs against the project's database (``DATABASE_URL``, or the embedded PostgreSQL).
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
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
LEXICAL = "memory_app.providers.embeddings.LexicalEmbedder"
MINILM = "memory_app.providers.embeddings.SentenceTransformerEmbedder"
# name: (embedder, search mode)
MODES = {
    "lexical": (LEXICAL, "vector"),
    "fulltext": (LEXICAL, "fulltext"),
    "vector": (MINILM, "vector"),
    "hybrid": (MINILM, "hybrid"),
    "hybrid-lexical": (LEXICAL, "hybrid"),
}
KS = (5, 10)
DIA_ID = re.compile(r"D\d+:\d+")


def load_conversation(path: Path) -> tuple[str, list[dict], list[dict]]:
    """``(sample id, turns in order, questions with evidence)`` of one LoCoMo file."""
    data = json.loads(path.read_text())
    conversation = data.get("conversation", data)  # the original release nests it
    speaker_a = conversation["speaker_a"]
    numbers = sorted(
        int(k.split("_")[1])
        for k in conversation
        if re.fullmatch(r"session_\d+", k) and isinstance(conversation[k], list)
    )
    turns = []
    for n in numbers:
        for turn in conversation[f"session_{n}"]:
            text = f"{turn['speaker']}: {turn['text']}"
            if turn.get("blip_caption"):
                text += f" [shares {turn['blip_caption']}]"
            turns.append(
                {
                    "role": "user" if turn["speaker"] == speaker_a else "assistant",
                    "content": text,
                    "metadata": {
                        "dia_id": turn["dia_id"],
                        "speaker": turn["speaker"],
                        "session_date": conversation.get(f"session_{n}_date_time", ""),
                    },
                }
            )
    known = {t["metadata"]["dia_id"] for t in turns}
    questions = []
    for qa in data["qa"]:
        if qa.get("category") not in CATEGORIES:
            continue
        evidence = {
            e for item in qa.get("evidence") or [] for e in DIA_ID.findall(str(item))
        } & known
        if evidence:
            questions.append(
                {"question": qa["question"], "evidence": evidence, "category": qa["category"]}
            )
    return data.get("sample_id", path.stem), turns, questions


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data",
        type=Path,
        default=ROOT / "bench" / "data" / "locomo",
        help="folder of LoCoMo conversation files (*.json)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "bench" / "results" / "locomo.md",
        help="markdown report to write",
    )
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated modes to run")
    parser.add_argument("--keep", action="store_true", help="keep the benchmark sessions")
    parser.add_argument(
        "--app",
        action="store_true",
        help="with --folds: choose the app's search settings on four conversations, measure them "
        "through search() on the fifth (writes bench/results/locomo-app.md unless --out is given)",
    )
    parser.add_argument(
        "--folds",
        action="store_true",
        help="leave-one-conversation-out: tune on four, report on the fifth "
        "(writes bench/results/locomo-folds.md unless --out is given)",
    )
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"unknown modes: {', '.join(sorted(unknown))}")
    files = sorted(args.data.glob("*.json"))
    if not files:
        parser.error(f"no LoCoMo *.json files in {args.data}")

    import django

    django.setup()
    if args.app and not args.folds:
        parser.error("--app goes with --folds")
    if args.app:
        out = (
            args.out
            if args.out != parser.get_default("out")
            else args.out.with_name("locomo-app.md")
        )
        app_folds([load_conversation(path) for path in files], out, keep=args.keep)
        return 0
    if args.folds:
        from bench import locomo_folds

        out = (
            args.out
            if args.out != parser.get_default("out")
            else args.out.with_name("locomo-folds.md")
        )
        locomo_folds.run([load_conversation(path) for path in files], out)
        return 0
    from django.db import connection
    from django.test.utils import override_settings

    started = time.perf_counter()
    conversations = store([load_conversation(path) for path in files])
    load_seconds = time.perf_counter() - started
    n_turns = sum(len(c[3]) for c in conversations)
    n_questions = sum(len(c[2]) for c in conversations)
    print(
        f"loaded {len(conversations)} conversations, {n_turns} turns, {n_questions} questions "
        f"(categories 1-4) in {load_seconds:.1f}s",
        file=sys.stderr,
    )

    embed_seconds: dict[str, float] = {}
    scores: dict[str, dict] = {}
    try:
        for name in modes:
            embedder, search_mode = MODES[name]
            with override_settings(MEMORY_APP={"EMBEDDER": embedder}):
                if embedder not in embed_seconds and search_mode != "fulltext":
                    t0 = time.perf_counter()
                    for _, mem, _, _ in conversations:
                        mem.embed()
                    embed_seconds[embedder] = time.perf_counter() - t0
                    print(
                        f"embedded with {embedder.rsplit('.', 1)[1]} in "
                        f"{embed_seconds[embedder]:.1f}s",
                        file=sys.stderr,
                    )
                scores[name] = evaluate(conversations, search_mode)
            s = scores[name]
            print(
                f"{name:15s} R@5 {s['recall'][5]:.3f}  R@10 {s['recall'][10]:.3f}  "
                f"hit@5 {s['hit'][5]:.3f}  hit@10 {s['hit'][10]:.3f}",
                file=sys.stderr,
            )
    finally:
        if not args.keep:
            for _, mem, _, _ in conversations:
                mem.delete()

    with connection.cursor() as cursor:
        cursor.execute("SELECT version()")
        server = (
            cursor.fetchone()[0].split(" on ")[0]
            if connection.vendor == "postgresql"
            else connection.vendor
        )
        pgvector = ""
        if connection.vendor == "postgresql":
            cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
            row = cursor.fetchone()
            pgvector = f", pgvector {row[0]}" if row else ""
    report = render(
        scores, modes, conversations, n_turns, n_questions, embed_seconds, f"{server}{pgvector}"
    )
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def store(loaded: list[tuple[str, list[dict], list[dict]]]) -> list[tuple]:
    """Each conversation as one session of a throw-away namespace, one message per turn:
    ``(sample id, memory, questions, {cursor: dia_id})``. Nothing is embedded yet."""
    from django.core.management import call_command
    from django.test.utils import override_settings

    from memory_app import Memory

    call_command("migrate", verbosity=0)
    namespace = f"locomo-bench-{uuid.uuid4().hex[:8]}"
    conversations = []
    with override_settings(MEMORY_APP={"EMBED_ON_APPEND": False, "IMPORTANCE_THRESHOLD": None}):
        for sample, turns, questions in loaded:
            mem = Memory.create(str(sample), namespace=namespace, title=f"LoCoMo {sample}")
            for start in range(0, len(turns), 1000):
                mem.add_many(turns[start : start + 1000])
            by_cursor = {m.cursor: m.metadata["dia_id"] for m in mem.messages()}
            conversations.append((sample, mem, questions, by_cursor))
    return conversations


def per_question(conversation, search_mode: str) -> list[tuple[float, float, float]]:
    """``(recall@5, recall@10, hit@10)`` of every question of one stored conversation, searched
    through the app's ``search()`` with the settings in force."""
    _, mem, questions, by_cursor = conversation
    rows = []
    for q in questions:
        found = [by_cursor.get(r.cursor) for r in mem.search(q["question"], 10, mode=search_mode)]
        got5, got10 = len(q["evidence"] & set(found[:5])), len(q["evidence"] & set(found))
        n = len(q["evidence"])
        rows.append((got5 / n, got10 / n, 1.0 if got10 else 0.0))
    return rows


def app_folds(loaded, out: Path, *, keep: bool = False) -> str:
    """Leave one conversation out, through the app: per fold, the search settings are chosen on
    the other four conversations (offline rankings, ``locomo_folds.choose_app_settings``) and
    measured on the held-out one with the app's own ``search()``, the local model embedding."""
    from django.test.utils import override_settings

    from bench import locomo_folds
    from memory_app.conf import DEFAULTS, MemorySettings
    from memory_app.providers.embeddings import get_embedder

    started = time.perf_counter()
    chosen = locomo_folds.choose_app_settings(loaded)
    print(f"settings chosen per fold in {time.perf_counter() - started:.1f}s", file=sys.stderr)
    conversations = store(loaded)
    app = {}  # (mode, settings as a sorted tuple) -> per conversation rows
    try:
        with override_settings(MEMORY_APP={}):  # the app's defaults
            embedder = get_embedder()
            t0 = time.perf_counter()
            for _, mem, _, _ in conversations:
                mem.embed()
            print(
                f"embedded with {embedder.name} in {time.perf_counter() - t0:.1f}s", file=sys.stderr
            )

        def measure(mode: str, settings: dict) -> list[np.ndarray]:
            key = (mode, tuple(sorted(settings.items())))
            if key not in app:
                with override_settings(MEMORY_APP=settings):
                    app[key] = [np.asarray(per_question(c, mode)) for c in conversations]
            return app[key]

        folds = chosen["folds"]
        rows = []
        for held, sample in enumerate(chosen["samples"]):
            config = folds["hybrid"][held]["config"]
            match = folds["fulltext"][held]["config"]["match"]
            rows.append(
                {
                    "sample": sample,
                    "config": config,
                    "train_r10": folds["hybrid"][held]["train_r10"],
                    "offline_r10": folds["hybrid"][held]["offline"][1],
                    "match": match,
                    "hybrid": measure("hybrid", locomo_folds.app_settings(config))[held].mean(0),
                    "vector": measure("vector", {})[held].mean(0),
                    "fulltext": measure("fulltext", {"FULLTEXT_MATCH": match})[held].mean(0),
                }
            )
        defaults = locomo_folds.app_config(MemorySettings(DEFAULTS))
        fixed = {
            "the app's defaults": (defaults, measure("hybrid", {})),
            "RRF, the fusion before (k=60, 50 candidates, no boost)": (
                None,
                measure("hybrid", {"FUSION": "rrf", "NEIGHBOUR_BOOST": 0, "HYBRID_CANDIDATES": 50}),
            ),
        }
    finally:
        if not keep:
            for _, mem, _, _ in conversations:
                mem.delete()
    report = render_app(chosen, rows, fixed, defaults, embedder.name)
    print(report)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    print(f"wrote {out}", file=sys.stderr)
    return report


def render_app(chosen, rows, fixed, defaults, embedder_name) -> str:
    from collections import Counter

    from bench import locomo_folds

    describe = locomo_folds.describe
    lines = [
        "# LoCoMo recall through the app, leave one conversation out",
        "",
        f"{len(rows)} conversations ({', '.join(str(r['sample']) for r in rows)}), questions of "
        f"categories 1-4, vectors by {embedder_name} (the default embedder with the "
        "local-embeddings extra). For each held-out conversation, the hybrid search settings "
        "(FUSION, FUSION_NORMALISATION, FUSION_VECTOR_WEIGHT, RRF_K, NEIGHBOUR_BOOST, "
        "HYBRID_CANDIDATES) and full text's FULLTEXT_MATCH are chosen on the other four "
        f"({chosen['sizes']['hybrid']} hybrid settings tried, best recall@10 over their "
        "questions, from offline rankings), then the held-out conversation is searched through "
        "the app's `search()` with them (session scope, limit 10). Every figure in the first two "
        "tables is held out: it was not tuned on the conversation it is measured on.",
        "",
        "| mode | recall@5 | recall@10 (min-max) | hit@10 (min-max) |",
        "|---|---:|---:|---:|",
    ]
    for mode in ("vector", "fulltext", "hybrid"):
        r5 = [r[mode][0] for r in rows]
        r10 = [r[mode][1] for r in rows]
        h10 = [r[mode][2] for r in rows]
        lines.append(
            f"| {mode} | {statistics.fmean(r5):.3f} | {statistics.fmean(r10):.3f} "
            f"({min(r10):.3f}-{max(r10):.3f}) | {statistics.fmean(h10):.3f} "
            f"({min(h10):.3f}-{max(h10):.3f}) |"
        )
    lines += [
        "",
        "Per fold (recall@10 on the held-out conversation; offline: the same settings scored "
        "on the offline rankings, a check that they are the app's):",
        "",
        "| held out | vector | fulltext | hybrid | hybrid, offline | hybrid >= best single | "
        "settings chosen on the other four (their recall@10) |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        ok = "yes" if r["hybrid"][1] >= max(r["vector"][1], r["fulltext"][1]) - 1e-12 else "**no**"
        lines.append(
            f"| {r['sample']} | {r['vector'][1]:.3f} | {r['fulltext'][1]:.3f} | "
            f"{r['hybrid'][1]:.3f} | {r['offline_r10']:.3f} | {ok} | {describe(r['config'])}, "
            f"fulltext match={r['match']} ({r['train_r10']:.3f}) |"
        )
    counts = Counter(describe(r["config"]) for r in rows)
    agree = counts.get(describe(defaults), 0)
    lines += [
        "",
        "Fixed settings through the app, per conversation. Not held out in the strict sense: "
        "the defaults are the folds' most frequent choice, a choice that saw every "
        "conversation but one, five times over.",
        "",
        "| settings | recall@5 | recall@10 (min-max) | hit@10 (min-max) |",
        "|---|---:|---:|---:|",
    ]
    for name, (_config, per_conv) in fixed.items():
        means = [m.mean(0) for m in per_conv]
        r10 = [m[1] for m in means]
        h10 = [m[2] for m in means]
        lines.append(
            f"| {name} | {statistics.fmean(m[0] for m in means):.3f} | {statistics.fmean(r10):.3f} "
            f"({min(r10):.3f}-{max(r10):.3f}) | {statistics.fmean(h10):.3f} "
            f"({min(h10):.3f}-{max(h10):.3f}) |"
        )
    lines += [
        "",
        f"The app's defaults: {describe(defaults)}; {agree} of the {len(rows)} folds chose exactly "
        "these.",
        "",
        "Reproduce: `python bench/locomo_recall.py --folds --app`.",
        "",
    ]
    return "\n".join(lines)


def evaluate(conversations, search_mode: str) -> dict:
    """Search every question; recall@k and hit@k overall and per category, and latency."""
    recall = {k: [] for k in KS}
    hit = {k: [] for k in KS}
    per_category = defaultdict(lambda: {k: [] for k in KS})
    latencies = []
    for _, mem, questions, by_cursor in conversations:
        for q in questions:
            t0 = time.perf_counter()
            results = mem.search(q["question"], limit=max(KS), mode=search_mode)
            latencies.append(time.perf_counter() - t0)
            found = [by_cursor.get(r.cursor) for r in results]
            for k in KS:
                got = len(q["evidence"] & set(found[:k]))
                recall[k].append(got / len(q["evidence"]))
                hit[k].append(1.0 if got else 0.0)
                per_category[q["category"]][k].append(got / len(q["evidence"]))
    return {
        "recall": {k: statistics.fmean(v) for k, v in recall.items()},
        "hit": {k: statistics.fmean(v) for k, v in hit.items()},
        "category": {
            c: {k: statistics.fmean(v) for k, v in ks.items()} for c, ks in per_category.items()
        },
        "count": {c: len(ks[KS[0]]) for c, ks in per_category.items()},
        "latency_ms": 1000 * statistics.median(latencies),
    }


DESCRIPTIONS = {
    "lexical": "vector, LexicalEmbedder (hashed words + trigrams, 512d)",
    "fulltext": "PostgreSQL full-text (websearch_to_tsquery, any word, ts_rank)",
    "vector": "vector, all-MiniLM-L6-v2 (384d, local)",
    "hybrid": "MiniLM vector + full-text, RRF (k=60)",
    "hybrid-lexical": "lexical vector + full-text, RRF (k=60)",
}


def render(scores, modes, conversations, n_turns, n_questions, embed_seconds, server) -> str:
    lines = [
        "# LoCoMo recall",
        "",
        f"{len(conversations)} conversations ({', '.join(str(c[0]) for c in conversations)}), "
        f"{n_turns} turns stored one message per turn, {n_questions} questions of categories 1-4. "
        "Each question searches its own conversation (session scope). recall@k: share of a "
        "question's evidence turns in the top k, averaged; hit@k: share of questions with at "
        "least one evidence turn in the top k. Median search time includes embedding the query "
        "(CPU, indicative only).",
        "",
        "| mode | what | recall@5 | recall@10 | hit@5 | hit@10 | median search |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name in modes:
        s = scores[name]
        lines.append(
            f"| {name} | {DESCRIPTIONS[name]} | {s['recall'][5]:.3f} | {s['recall'][10]:.3f} "
            f"| {s['hit'][5]:.3f} | {s['hit'][10]:.3f} | {s['latency_ms']:.1f} ms |"
        )
    categories = sorted({c for s in scores.values() for c in s["category"]})
    counts = next(iter(scores.values()))["count"] if scores else {}
    lines += [
        "",
        "recall@10 by question category:",
        "",
        "| mode | "
        + " | ".join(f"{c} {CATEGORIES[c]} (n={counts.get(c, 0)})" for c in categories)
        + " |",
        "|---|" + "---:|" * len(categories),
    ]
    for name in modes:
        cat = scores[name]["category"]
        lines.append(f"| {name} | " + " | ".join(f"{cat[c][10]:.3f}" for c in categories) + " |")
    lines += [
        "",
        f"Embedding time (all turns, {os.cpu_count()} CPU cores): "
        + ", ".join(f"{e.rsplit('.', 1)[1]} {s:.1f}s" for e, s in embed_seconds.items())
        + f". Database: {server}.",
        "",
        "Reproduce: `python bench/locomo_recall.py` (data: `--data`, default bench/data/locomo).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
