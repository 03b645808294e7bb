"""Throughput of the local embedding model (all-MiniLM-L6-v2): turns embedded per second.

    python bench/embed_bench.py                    # 1,000 LoCoMo turns, 3 rounds
    python bench/embed_bench.py --turns 2760 --rounds 5 --out bench/results/embed.md

Texts are real conversation turns (``bench/data/locomo``, stored the way ``locomo_recall.py``
stores them). Every configuration embeds the same turns through
``SentenceTransformerEmbedder.embed()`` in chunks of ``EMBED_BATCH_SIZE`` (256), the way the
embedding task and ``memory_embed`` call it. The configurations take turns, one round at a time,
so load from elsewhere on the machine falls on all of them alike; the table gives the median
and the best round. The ONNX graph is exported before timing starts (once per machine: it is
cached, see ``default_onnx_cache()``).

Needs the ``local-embeddings`` extra, and ``onnx`` for the ONNX rows (skipped without it). The
8-bit graph is quantized from the exported one before timing starts, once per machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from bench.locomo_recall import load_conversation  # noqa: E402

CHUNK = 256  # MEMORY_APP["EMBED_BATCH_SIZE"]'s default: what one embedding step hands the model

# name: (constructor options, what it is)
CONFIGS = {
    "before": (
        {"backend": "torch", "sort_by_length": False},
        "torch, batches of 32 in arrival order (the embedder before this change)",
    ),
    "torch-sorted": ({"backend": "torch"}, "torch, batches of 32 sorted by length"),
    "onnx": (
        {"backend": "onnx", "quantize": False, "threads": 2},
        "ONNX Runtime, float graph, 2 threads, batches of 32 sorted by length",
    ),
    "onnx-1thread": (
        {"backend": "onnx", "quantize": False, "threads": 1},
        "ONNX Runtime, float graph, one thread",
    ),
    "onnx-b64": (
        {"backend": "onnx", "quantize": False, "threads": 2, "batch_size": 64},
        "ONNX Runtime, float graph, 2 threads, batches of 64",
    ),
    "onnx-int8-2threads": (
        {"backend": "onnx", "quantize": True, "threads": 2},
        "ONNX Runtime, 8-bit weights (dynamic quantization), 2 threads, batches of 32 sorted",
    ),
    "onnx-int8": (
        {},
        "the default: ONNX Runtime, 8-bit weights, half the CPUs' threads (1 on 2 cores), "
        "batches of 32 sorted",
    ),
}


def turns(data: Path, n: int) -> list[str]:
    texts: list[str] = []
    for path in sorted(data.glob("*.json")):
        texts += [t["content"] for t in load_conversation(path)[1]]
    if not texts:
        raise SystemExit(f"no LoCoMo *.json files in {data}")
    return texts[:n]


def run(embedder, texts: list[str]) -> float:
    started = time.perf_counter()
    for start in range(0, len(texts), CHUNK):
        embedder.embed(texts[start : start + CHUNK])
    return len(texts) / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT / "bench" / "data" / "locomo")
    parser.add_argument("--turns", type=int, default=1000, help="turns embedded per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "embed.md")
    args = parser.parse_args()
    from django.conf import settings

    if not settings.configured:
        settings.configure()  # the embedder reads no setting; nothing else is needed here
    from django.core.exceptions import ImproperlyConfigured

    from memory_app.providers.embeddings import SentenceTransformerEmbedder

    texts = turns(args.data, args.turns)
    embedders = {}
    for name in [c.strip() for c in args.configs.split(",") if c.strip()]:
        options, _ = CONFIGS[name]
        embedder = SentenceTransformerEmbedder(**options)
        try:
            embedder.embed(texts[:8])  # load (and export) before timing; warm up
        except ImproperlyConfigured as why:
            print(f"skipping {name}: {why}", file=sys.stderr)
            continue
        embedders[name] = embedder
    rates: dict[str, list[float]] = {name: [] for name in embedders}
    loads: dict[str, list[float]] = {name: [] for name in embedders}
    for round_ in range(args.rounds):
        for name, embedder in embedders.items():
            before = os.getloadavg()[0]
            rates[name].append(run(embedder, texts))
            # The 1-minute load average around the round (this process adds up to its threads).
            loads[name] += [before, os.getloadavg()[0]]
            print(
                f"round {round_ + 1}: {name:18s} {rates[name][-1]:6.1f} turns/s "
                f"(load average {before:.2f}-{os.getloadavg()[0]:.2f})",
                file=sys.stderr,
            )

    mean_chars = statistics.fmean(len(t) for t in texts)
    load = os.getloadavg()[0]
    lines = [
        "# Embedding throughput (all-MiniLM-L6-v2)",
        "",
        f"{len(texts)} LoCoMo turns (mean {mean_chars:.0f} characters), {args.rounds} rounds, "
        f"{os.cpu_count()} CPU cores (load average {load:.1f} at the end), in chunks of {CHUNK} "
        "as the embedding task hands them over. The load column is the 1-minute load average "
        "before and after each of its rounds (lowest-highest); the bench itself adds up to its "
        "thread count.",
        "",
        "| configuration | what | turns/s (median) | best round | load average |",
        "|---|---|---:|---:|---:|",
    ]
    for name, values in rates.items():
        lines.append(
            f"| {name} | {CONFIGS[name][1]} | {statistics.median(values):.1f} | {max(values):.1f} "
            f"| {min(loads[name]):.1f}-{max(loads[name]):.1f} |"
        )
    lines += [
        "",
        f"Reproduce: `python bench/embed_bench.py --turns {args.turns} --rounds {args.rounds}"
        + (f" --configs {','.join(rates)}" if list(rates) != list(CONFIGS) else "")
        + "`.",
        "",
    ]
    report = "\n".join(lines)
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
