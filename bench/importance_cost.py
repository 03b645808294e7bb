"""What scoring a user's message for importance costs, by length, on real conversation text.

    python bench/importance_cost.py     # a few seconds; no database

The default ``KeywordImportanceScorer`` against the same patterns searched the plain way (each
with ``re.IGNORECASE`` over the whole message, as the scorer did before it searched from each
pattern's literal). Texts are the LoCoMo turns in ``bench/data/locomo`` as they are, and runs of
their words cut to 60, 250 and 750 words; every text is scored by both, and both must agree.
Writes ``bench/results/importance_cost.md``.
"""

from __future__ import annotations

import os
import platform
import re
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import RESULTS, markdown_table  # noqa: E402
from bench.locomo_recall import load_conversation  # noqa: E402
from bench.store_bench import _conversation_words  # noqa: E402

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "demo_project.settings")


def plain(patterns):
    compiled = [(re.compile(p, re.IGNORECASE), w) for p, w in patterns]
    return lambda text: [(p.pattern, w) for p, w in compiled if p.search(text)]


def per_text_us(score, texts, rounds=5) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for text in texts:
            score(text)
        best = min(best, time.perf_counter() - started)
    return best / len(texts) * 1e6


def main() -> None:
    import django

    django.setup()
    from memory_app.importance import KeywordImportanceScorer

    scorer = KeywordImportanceScorer()
    reference = plain(KeywordImportanceScorer.PATTERNS)

    def ours(text):
        return scorer.explain(SimpleNamespace(role="user", content=text))

    turns = [
        t["content"]
        for path in sorted((ROOT / "bench" / "data" / "locomo").glob("*.json"))
        for t in load_conversation(path)[1]
    ]
    words = _conversation_words()
    sets = {f"real turns ({len(turns):,}, as they are)": turns}
    for n in (60, 250, 750):
        count = min(200, len(words) // n)  # runs that do not overlap
        sets[f"{n} words ({count} texts)"] = [
            " ".join(words[i : i + n]) for i in range(0, count * n, n)
        ]
    rows = []
    for name, texts in sets.items():
        assert all(ours(t) == reference(t) for t in texts), name
        matched = sum(1 for t in texts if reference(t))
        before, after = per_text_us(reference, texts), per_text_us(ours, texts)
        rows.append(
            (name, f"{matched / len(texts):.0%}", f"{before:.1f}", f"{after:.1f}",
             f"{before / after:.1f}x")
        )  # fmt: skip
    table = markdown_table(
        ["texts", "holding a phrase", "plain search (µs)", "the scorer (µs)", "faster"], rows
    )
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    text = (
        "# What importance scoring costs a user's message\n\n"
        f"{table}\n\n"
        "Per text, the best of 5 rounds; both find the same phrases in every text. Machine: "
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"load average {load}.\n\nReproduce: `python bench/importance_cost.py`\n"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "importance_cost.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
