"""Leave-one-conversation-out evaluation of recall: ``python bench/locomo_recall.py --folds``.

Every tunable choice is made on four conversations and measured on the fifth, for each of the
five; the figures reported are the held-out ones (mean over the folds, and the worst and best
fold), so nothing is tuned on what it is measured on.

What is tuned, per mode:

- what is indexed: the turn alone (``turn``), the turn between its neighbours in the same
  session (``neighbours``), or the turn after its session's date (``date``);
- full-text query processing: any query word (``any``, today's default) or all of them (``all``);
- hybrid: the candidates each ranking contributes (``depth``), the fusion (weighted RRF with
  its k, min-max or z-score CombSUM with the vector weight, or a per-query confident choice),
  and a re-ranking by neighbouring turns (``boost``). The fusions are the pure functions of
  ``memory_app.services.fusion``, the ones search can use as they are.

How the rankings are made: full-text by PostgreSQL with the search's own expression
(``websearch_to_tsquery('english', ...)`` with the words ORed, ``ts_rank`` over
``to_tsvector('english', text)``, ties newest first), from a temporary table of this run;
vector rankings as an exact cosine scan (what session-scope search does) over vectors computed
once by the embedders and cached on disk under ``bench/.cache/embeddings`` (git-ignored), keyed
by the model and a hash of the texts, so a second run embeds nothing. The reference row (today's
settings: turn alone, RRF k=60, 50 candidates) reproduces the figures of the plain run.
"""

from __future__ import annotations

import hashlib
import itertools
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench import fusion_variants
from memory_app.services import fusion

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "bench" / ".cache" / "embeddings"
DEPTH = 100  # candidates computed per ranking; configurations use a prefix
TEXT_VARIANTS = ("turn", "neighbours", "date")
FULLTEXT_VARIANTS = ("turn", "neighbours")


# ---- what is indexed -------------------------------------------------------------------------------


def indexed_texts(turns: list[dict], variant: str) -> list[str]:
    contents = [t["content"] for t in turns]
    if variant == "turn":
        return contents
    if variant == "date":
        return [
            f"[{t['metadata']['session_date'].split(' on ')[-1]}] {t['content']}" for t in turns
        ]
    session = [t["metadata"]["dia_id"].split(":")[0] for t in turns]
    out = []
    for i, text in enumerate(contents):
        before = contents[i - 1] if i > 0 and session[i - 1] == session[i] else ""
        after = contents[i + 1] if i + 1 < len(contents) and session[i + 1] == session[i] else ""
        out.append(" ".join(x for x in (before, text, after) if x))
    return out


def neighbour_map(turns: list[dict]) -> dict[int, tuple[int, ...]]:
    session = [t["metadata"]["dia_id"].split(":")[0] for t in turns]
    return {
        i: tuple(j for j in (i - 1, i + 1) if 0 <= j < len(turns) and session[j] == session[i])
        for i in range(len(turns))
    }


def app_neighbour_map(turns: list[dict]) -> dict[int, tuple[int, ...]]:
    """The app's neighbours: the turns just before and after in the stored session (one session
    per conversation, so across LoCoMo's dated sessions too)."""
    return {i: tuple(j for j in (i - 1, i + 1) if 0 <= j < len(turns)) for i in range(len(turns))}


def cached_vectors(embedder, texts: list[str]) -> np.ndarray:
    digest = hashlib.sha256("\x1e".join([embedder.name, *texts]).encode()).hexdigest()[:20]
    slug = "".join(c if c.isalnum() else "-" for c in embedder.name)
    path = CACHE / f"{slug}-{digest}.npy"
    if path.exists():
        return np.load(path)
    matrix = np.asarray(embedder.embed(texts), dtype=np.float32)
    matrix /= np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
    CACHE.mkdir(parents=True, exist_ok=True)
    np.save(path.with_suffix(".partial.npy"), matrix)
    path.with_suffix(".partial.npy").replace(path)
    return matrix


# ---- the rankings ---------------------------------------------------------------------------------


def vector_rankings(doc: np.ndarray, queries: np.ndarray) -> list[list[tuple[int, float]]]:
    sims = queries @ doc.T
    out = []
    for row in sims:
        top = np.argsort(-row, kind="stable")[:DEPTH]
        out.append([(int(i), float(row[i])) for i in top])
    return out


def fulltext_rankings(cursor, conv: int, variant: str, questions: list[str], match: str):
    rankings = []
    for q in questions:
        cursor.execute(
            "WITH parsed AS (SELECT websearch_to_tsquery('english'::regconfig, %s) AS q), "
            "tsq AS (SELECT CASE WHEN %s AND strpos(q::text, '!') = 0 "
            "THEN replace(q::text, ' & ', ' | ')::tsquery ELSE q END AS q FROM parsed) "
            "SELECT idx, ts_rank(doc, tsq.q) AS rank FROM locomo_docs CROSS JOIN tsq "
            "WHERE conv = %s AND variant = %s AND doc @@ tsq.q ORDER BY rank DESC, idx DESC LIMIT %s",
            [q, match == "any", conv, variant, DEPTH],
        )
        rankings.append([(int(i), float(r)) for i, r in cursor.fetchall()])
    return rankings


# ---- configurations --------------------------------------------------------------------------------


def hybrid_grid():
    fusions = [("rrf", {"k": k, "wv": wv}) for k in (10, 60) for wv in (0.3, 0.5, 0.7)]
    fusions += [("minmax", {"wv": wv}) for wv in (0.3, 0.4, 0.5, 0.6, 0.7)]
    fusions += [("z", {"wv": wv}) for wv in (0.3, 0.5, 0.7)]
    fusions += [("confident", {"threshold": t}) for t in (2.0, 4.0)]
    for vec, ft, depth, (kind, params), boost in itertools.product(
        TEXT_VARIANTS, FULLTEXT_VARIANTS, (50, 100), fusions, BOOSTS
    ):
        yield {
            "vector": vec,
            "fulltext": ft,
            "depth": depth,
            "fusion": kind,
            **params,
            "boost": boost,
        }


BOOSTS = (0.0, 0.15, 0.3, 0.5)
HYBRIDS = {"hybrid": "vec", "hybrid-lexical": "lex"}  # mode: the vectors fused with full-text
REFERENCE = {
    "vector": "turn",
    "fulltext": "turn",
    "depth": 50,
    "fusion": "rrf",
    "k": 60,
    "wv": 0.5,
    "boost": 0.0,
}


def fuse(config: dict, vec: list, ft: list, neighbours: dict) -> list:
    d = config["depth"]
    rankings = {"vector": vec[:d], "fulltext": ft[:d]}
    kind = config["fusion"]
    weights = {"vector": config.get("wv", 0.5), "fulltext": 1 - config.get("wv", 0.5)}
    if kind == "rrf":
        fused = fusion.weighted_rrf(rankings, k=config["k"], weights=weights)
    elif kind in ("minmax", "z"):
        fused = fusion.combsum(rankings, weights=weights, method=kind)
    else:
        fused = fusion_variants.confident_choice(
            rankings, fusion.weighted_rrf(rankings, k=60), threshold=config["threshold"]
        )
    return fusion.neighbour_boost(fused, neighbours, weight=config["boost"])


def metrics(ids: list[int], evidence: set[int]) -> tuple[float, float, float]:
    top5, top10 = set(ids[:5]), set(ids[:10])
    got10 = len(evidence & top10)
    return len(evidence & top5) / len(evidence), got10 / len(evidence), 1.0 if got10 else 0.0


def describe(config: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in config.items())


# ---- the run ---------------------------------------------------------------------------------------


def run(conversations: list[tuple[str, list[dict], list[dict]]], out: Path | None = None) -> str:
    """``conversations``: ``(sample id, turns, questions)`` as ``load_conversation`` gives them."""

    convs = prepare(conversations)
    return score_and_report(convs, out)


def prepare(
    conversations: list[tuple[str, list[dict], list[dict]]],
    *,
    variants: tuple[str, ...] = TEXT_VARIANTS,
    fulltext_variants: tuple[str, ...] = FULLTEXT_VARIANTS,
    lexical: bool = True,
) -> list[dict]:
    """Every question's rankings, per mode and indexed variant, from PostgreSQL and the cached
    vectors."""
    from django.db import connection

    from memory_app.providers.embeddings import LexicalEmbedder, SentenceTransformerEmbedder

    started = time.perf_counter()
    embedders = {"vec": SentenceTransformerEmbedder()}
    if lexical:
        embedders["lex"] = LexicalEmbedder()
    convs = []
    for sample, turns, questions in conversations:
        index = {t["metadata"]["dia_id"]: i for i, t in enumerate(turns)}
        qs = [
            {
                "text": q["question"],
                "evidence": {index[e] for e in q["evidence"]},
                "category": q["category"],
            }
            for q in questions
        ]
        convs.append(
            {
                "sample": sample,
                "turns": turns,
                "questions": qs,
                "neighbours": neighbour_map(turns),
                "app_neighbours": app_neighbour_map(turns),
                "texts": {v: indexed_texts(turns, v) for v in variants},
            }
        )

    # Rankings of every question, per mode and variant.
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TEMP TABLE locomo_docs (conv int, variant text, idx int, doc tsvector)"
        )
        for c, conv in enumerate(convs):
            for v in fulltext_variants:
                cursor.executemany(
                    "INSERT INTO locomo_docs VALUES (%s, %s, %s, to_tsvector('english'::regconfig, %s))",
                    [(c, v, i, text) for i, text in enumerate(conv["texts"][v])],
                )
        cursor.execute("CREATE INDEX ON locomo_docs (conv, variant)")
        for c, conv in enumerate(convs):
            texts = [q["text"] for q in conv["questions"]]
            conv["ft"] = {
                (v, m): fulltext_rankings(cursor, c, v, texts, m)
                for v in fulltext_variants
                for m in ("any", "all")
            }
        cursor.execute("DROP TABLE locomo_docs")
    for conv in convs:
        texts = [q["text"] for q in conv["questions"]]
        for name, embedder in embedders.items():
            queries = cached_vectors(embedder, texts)
            conv[name] = {
                v: vector_rankings(cached_vectors(embedder, conv["texts"][v]), queries)
                for v in variants
            }
    print(f"rankings ready in {time.perf_counter() - started:.1f}s", file=sys.stderr)
    return convs


def score_grids(
    convs: list[dict], grids: dict[str, list[dict]], ranking: Callable[[str, dict, dict, int], list]
) -> dict[str, list[list[np.ndarray]]]:
    """Per mode, per configuration, per conversation: one row per question of (recall@5,
    recall@10, hit@10) for the ranking ``ranking(mode, config, conv, question index)`` gives."""
    return {
        mode: [
            [
                np.asarray(
                    [
                        metrics([i for i, _ in ranking(mode, config, conv, qi)[:10]], q["evidence"])
                        for qi, q in enumerate(conv["questions"])
                    ]
                )
                for conv in convs
            ]
            for config in grid
        ]
        for mode, grid in grids.items()
    }


def score_and_report(convs: list[dict], out: Path | None) -> str:

    # Per configuration, per question: (recall@5, recall@10, hit@10).
    grids: dict[str, list[dict]] = {
        "lexical": [{"indexed": v} for v in TEXT_VARIANTS],
        "fulltext": [{"indexed": v, "match": m} for v in FULLTEXT_VARIANTS for m in ("any", "all")],
        "vector": [{"indexed": v} for v in TEXT_VARIANTS],
        "hybrid": [REFERENCE, *(g for g in hybrid_grid() if g != REFERENCE)],
    }
    grids["hybrid-lexical"] = grids["hybrid"]

    def ranking(mode: str, config: dict, conv: dict, qi: int) -> list:
        if mode == "lexical":
            return conv["lex"][config["indexed"]][qi]
        if mode == "vector":
            return conv["vec"][config["indexed"]][qi]
        if mode == "fulltext":
            return conv["ft"][(config["indexed"], config["match"])][qi]
        return fuse(
            config,
            conv[HYBRIDS[mode]][config["vector"]][qi],
            conv["ft"][(config["fulltext"], "any")][qi],
            conv["neighbours"],
        )

    t0 = time.perf_counter()
    scores = score_grids(convs, grids, ranking)
    print(
        f"{sum(len(g) for g in grids.values())} configurations scored in "
        f"{time.perf_counter() - t0:.1f}s",
        file=sys.stderr,
    )

    # Leave one conversation out: choose on the other four (their questions pooled), report here.
    folds: dict[str, list[dict]] = {}
    for mode, grid in grids.items():
        folds[mode] = []
        for held in range(len(convs)):

            def train_recall(ci, held=held, mode=mode):
                rows = np.concatenate([scores[mode][ci][c] for c in range(len(convs)) if c != held])
                return rows[:, 1].mean()

            best = max(range(len(grid)), key=lambda ci: (train_recall(ci), -ci))
            test = scores[mode][best][held].mean(axis=0)
            folds[mode].append(
                {
                    "config": grid[best],
                    "r5": test[0],
                    "r10": test[1],
                    "hit10": test[2],
                    "train_r10": train_recall(best),
                }
            )
    # Fixed configurations: today's settings, and per hybrid mode the folds' most frequent choice
    # (what a default would be). Their per-conversation figures are not held out in the strict
    # sense (the choice saw every conversation but one, five times), hence reported apart.
    reference, fixed = {}, {}
    for mode in HYBRIDS:
        reference[f"{mode}, today's settings"] = [
            scores[mode][0][c].mean(axis=0) for c in range(len(convs))
        ]
        fixed[mode] = Counter(describe(f["config"]) for f in folds[mode]).most_common(1)[0][0]
        index = next(i for i, g in enumerate(grids[mode]) if describe(g) == fixed[mode])
        reference[f"{mode}, the folds' most frequent choice"] = [
            scores[mode][index][c].mean(axis=0) for c in range(len(convs))
        ]

    report = render(convs, folds, reference, fixed, grids)
    print(report)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report)
        print(f"wrote {out}", file=sys.stderr)
    return report


def render(convs, folds, reference, fixed, grids) -> str:
    samples = [c["sample"] for c in convs]
    n_q = sum(len(c["questions"]) for c in convs)
    lines = [
        "# LoCoMo recall, leave one conversation out",
        "",
        f"{len(convs)} conversations ({', '.join(map(str, samples))}), {n_q} questions of categories "
        "1-4. For each held-out conversation every parameter is chosen on the other four (best "
        "recall@10 over their questions) and measured on it. Mean over the five held-out folds, "
        "with the worst and best fold.",
        "",
        "| mode | recall@5 | recall@10 (min-max) | hit@10 (min-max) | configurations tried |",
        "|---|---:|---:|---:|---:|",
    ]
    for mode, fs in folds.items():
        r5 = [f["r5"] for f in fs]
        r10 = [f["r10"] for f in fs]
        h10 = [f["hit10"] for f in fs]
        lines.append(
            f"| {mode} | {statistics.fmean(r5):.3f} | {statistics.fmean(r10):.3f} "
            f"({min(r10):.3f}-{max(r10):.3f}) | {statistics.fmean(h10):.3f} "
            f"({min(h10):.3f}-{max(h10):.3f}) | {len(grids[mode])} |"
        )
    fixed_names = [f"{mode}, the folds' most frequent choice" for mode in HYBRIDS]
    lines += [
        "",
        "Held-out recall@10 per fold (the conversation held out), the fixed most frequent "
        "choices beside them, and whether each hybrid is at least the best single mode there:",
        "",
        "| held out | "
        + " | ".join(folds)
        + " | hybrid fixed | hybrid-lexical fixed | hybrid >= best single |",
        "|---|" + "---:|" * (len(folds) + 2) + "---|",
    ]
    for i, sample in enumerate(samples):
        single = max(folds[m][i]["r10"] for m in ("lexical", "fulltext", "vector"))
        values = [
            folds["hybrid"][i]["r10"],
            folds["hybrid-lexical"][i]["r10"],
            *(reference[name][i][1] for name in fixed_names),
        ]
        ok = "yes" if min(values) >= single - 1e-12 else "**no**"
        lines.append(
            f"| {sample} | "
            + " | ".join(f"{folds[m][i]['r10']:.3f}" for m in folds)
            + " | "
            + " | ".join(f"{reference[name][i][1]:.3f}" for name in fixed_names)
            + f" | {ok} (all four) |"
        )
    lines += [
        "",
        "Fixed hybrid configurations, measured per conversation (not chosen per fold):",
        "",
        "| configuration | mean recall@5 | mean recall@10 (min-max) | mean hit@10 |",
        "|---|---:|---:|---:|",
    ]
    for name, rows in reference.items():
        r10 = [r[1] for r in rows]
        lines.append(
            f"| {name} | {statistics.fmean(r[0] for r in rows):.3f} | {statistics.fmean(r10):.3f} "
            f"({min(r10):.3f}-{max(r10):.3f}) | {statistics.fmean(r[2] for r in rows):.3f} |"
        )
    lines += ["", f"Today's settings: {describe(REFERENCE)}."]
    lines += [f"Most frequent choice, {mode}: {choice}." for mode, choice in fixed.items()]
    lines += ["", "What each fold chose (recall@10 on its four training conversations):", ""]
    for mode, fs in folds.items():
        for i, f in enumerate(fs):
            lines.append(
                f"- {mode}, held out {samples[i]}: {describe(f['config'])} "
                f"(train {f['train_r10']:.3f})"
            )
    lines += ["", "Reproduce: `python bench/locomo_recall.py --folds`.", ""]
    return "\n".join(lines)


# ---- the app's own settings ------------------------------------------------------------------------
#
# What search() can be configured to do without a schema change: vectors and full text of the
# turn alone (indexing the neighbours' text would need a new indexed column), the fusions of
# MEMORY_APP["FUSION"], and the neighbour boost over the stored session's turns. Used by
# ``locomo_recall.py --folds --app``, which chooses these settings per fold here and measures
# the choice through the app's search().

APP_BOOSTS = (0.0, 0.15, 0.3, 0.5, 0.75, 1.0)


def app_grid() -> list[dict]:
    fusions = [("rrf", {"k": k}) for k in (10, 60)]  # the app's RRF is unweighted
    fusions += [("minmax", {"wv": wv}) for wv in (0.3, 0.4, 0.5, 0.6, 0.7)]
    fusions += [("z", {"wv": wv}) for wv in (0.3, 0.5, 0.7)]
    return [
        {"depth": depth, "fusion": kind, **params, "boost": boost}
        for depth, (kind, params), boost in itertools.product((50, 100), fusions, APP_BOOSTS)
    ]


def app_settings(config: dict) -> dict:
    """The ``MEMORY_APP`` settings that make search() fuse as ``config`` does."""
    settings = {"HYBRID_CANDIDATES": config["depth"], "NEIGHBOUR_BOOST": config["boost"]}
    if config["fusion"] == "rrf":
        return {**settings, "FUSION": "rrf", "RRF_K": config["k"]}
    return {
        **settings,
        "FUSION": "combsum",
        "FUSION_NORMALISATION": config["fusion"],
        "FUSION_VECTOR_WEIGHT": config["wv"],
    }


def app_config(settings) -> dict:
    """The grid configuration of a ``memory_settings``-like object (the app's defaults)."""
    config = {"depth": int(settings.HYBRID_CANDIDATES)}
    if settings.FUSION == "rrf":
        config.update(fusion="rrf", k=settings.RRF_K)
    else:
        config.update(fusion=settings.FUSION_NORMALISATION, wv=settings.FUSION_VECTOR_WEIGHT)
    return {**config, "boost": settings.NEIGHBOUR_BOOST}


def app_fuse(config: dict, vec: list, ft: list, neighbours: dict) -> list:
    d = config["depth"]
    rankings = {"vector": vec[:d], "fulltext": ft[:d]}
    if config["fusion"] == "rrf":
        fused = fusion.weighted_rrf(rankings, k=config["k"])
    else:
        wv = config["wv"]
        fused = fusion.combsum(
            rankings, weights={"vector": wv, "fulltext": 1 - wv}, method=config["fusion"]
        )
    return fusion.neighbour_boost(fused, neighbours, weight=config["boost"])


def choose_app_settings(conversations: list[tuple[str, list[dict], list[dict]]]) -> dict:
    """Per held-out conversation, the app settings with the best recall@10 on the other four
    (their questions pooled), from the offline rankings; and every configuration's offline
    figures per conversation, to compare with what the app measures."""
    convs = prepare(conversations, variants=("turn",), fulltext_variants=("turn",), lexical=False)
    grids = {
        "vector": [{}],
        "fulltext": [{"match": "any"}, {"match": "all"}],
        "hybrid": app_grid(),
    }

    def ranking(mode: str, config: dict, conv: dict, qi: int) -> list:
        if mode == "vector":
            return conv["vec"]["turn"][qi]
        if mode == "fulltext":
            return conv["ft"][("turn", config["match"])][qi]
        return app_fuse(
            config, conv["vec"]["turn"][qi], conv["ft"][("turn", "any")][qi], conv["app_neighbours"]
        )

    scores = score_grids(convs, grids, ranking)
    folds: dict[str, list[dict]] = {}
    for mode, grid in grids.items():
        folds[mode] = []
        for held in range(len(convs)):
            train = [c for c in range(len(convs)) if c != held]

            def train_r10(ci, mode=mode, train=train):
                return np.concatenate([scores[mode][ci][c] for c in train])[:, 1].mean()

            best = max(range(len(grid)), key=lambda ci: (train_r10(ci), -ci))
            test = scores[mode][best][held].mean(axis=0)
            folds[mode].append(
                {"config": grid[best], "train_r10": train_r10(best), "offline": test}
            )

    def offline(config: dict) -> list[np.ndarray]:
        """Per conversation ``(recall@5, recall@10, hit@10)`` of a hybrid configuration."""
        index = next(i for i, g in enumerate(grids["hybrid"]) if g == config)
        return [scores["hybrid"][index][c].mean(axis=0) for c in range(len(convs))]

    return {
        "samples": [c["sample"] for c in convs],
        "folds": folds,
        "sizes": {mode: len(grid) for mode, grid in grids.items()},
        "offline": offline,
    }
