"""DjangoSaver against langgraph-checkpoint-postgres's PostgresSaver, on the same server, in one
process: put, put_writes, get_tuple (latest) and a list of 100 on a thread of 1,000 checkpoints.

    python bench/langgraph_bench.py            # writes bench/results/langgraph.md
    python bench/langgraph_bench.py --rounds 3 --checkpoints 1000

Both savers get the same checkpoints (two channels, one of them changed per step, as a chat
graph does), the same serialiser and a database of their own tables on the ``bench`` database.
Rounds alternate the two savers so drift on a shared machine hits both. Needs the ``bench``
extra (langgraph-checkpoint-postgres).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    RESULTS,
    fmt_ms,
    fmt_ratio,
    libpq_params,
    markdown_table,
    setup_django,
    time_calls,
)


def checkpoint(step: int, parent_versions: dict) -> tuple[dict, dict]:
    from langgraph.checkpoint.base import empty_checkpoint

    cp = empty_checkpoint()
    versions = {**parent_versions, "messages": step + 1, "step": step + 1}
    cp["channel_versions"] = versions
    cp["channel_values"] = {
        "messages": [{"role": "user", "content": f"turn {step} " + "word " * 20}],
        "step": step,
    }
    return cp, {"messages": step + 1, "step": step + 1}


def fill(saver, thread: str, n: int) -> dict:
    config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    versions: dict = {}
    for step in range(n):
        cp, new = checkpoint(step, versions)
        versions = cp["channel_versions"]
        config = saver.put(config, cp, {"source": "loop", "step": step}, new)
    return config


def measure(saver, *, long_thread: str, count: int, seconds: float) -> dict[str, float]:
    results = {}
    thread = f"put-{uuid.uuid4().hex}"
    state = {"config": {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}, "step": 0}

    def put():
        cp, new = checkpoint(state["step"], {})
        state["config"] = saver.put(
            state["config"], cp, {"source": "loop", "step": state["step"]}, new
        )
        state["step"] += 1

    results["put"] = time_calls(put, count=count, max_seconds=seconds).median

    def put_writes():
        saver.put_writes(
            state["config"],
            [("messages", {"role": "assistant", "content": "ok"}), ("step", 1)],
            uuid.uuid4().hex,
        )

    results["put_writes"] = time_calls(put_writes, count=count, max_seconds=seconds).median
    latest = {"configurable": {"thread_id": long_thread, "checkpoint_ns": ""}}
    results["get_tuple"] = time_calls(
        lambda: saver.get_tuple(latest), count=count, max_seconds=seconds
    ).median
    results["list 100"] = time_calls(
        lambda: list(saver.list(latest, limit=100)), count=max(10, count // 10), max_seconds=seconds
    ).median
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--checkpoints", type=int, default=1000)
    parser.add_argument("--count", type=int, default=300, help="timed calls per operation")
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_DEBUG", "0")  # DEBUG keeps a log of every query
    settings_dict = setup_django(
        memory_app={"EMBED_ON_APPEND": False, "SUMMARIZE_THRESHOLD_TOKENS": None}
    )
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    from memory_app.integrations.langgraph import DjangoSaver

    conn = psycopg.connect(
        **libpq_params(settings_dict), autocommit=True, prepare_threshold=0, row_factory=dict_row
    )
    theirs = PostgresSaver(conn)
    theirs.setup()
    ours = DjangoSaver(owner=None, namespace=f"bench-{uuid.uuid4().hex[:8]}")
    long_thread = f"long-{uuid.uuid4().hex}"
    savers = {"memory_app DjangoSaver": ours, "langgraph PostgresSaver": theirs}
    for saver in savers.values():
        fill(saver, long_thread, args.checkpoints)

    runs: dict[str, list[dict[str, float]]] = {name: [] for name in savers}
    for round_number in range(args.rounds):
        order = list(savers.items())
        if round_number % 2:
            order.reverse()
        for name, saver in order:
            runs[name].append(
                measure(saver, long_thread=long_thread, count=args.count, seconds=args.seconds)
            )
    operations = list(runs["memory_app DjangoSaver"][0])
    median = {
        name: {op: statistics.median(r[op] for r in rounds) for op in operations}
        for name, rounds in runs.items()
    }
    ours_m, theirs_m = median["memory_app DjangoSaver"], median["langgraph PostgresSaver"]
    rows = [
        [op, fmt_ms(ours_m[op]), fmt_ms(theirs_m[op]), fmt_ratio(ours_m[op] / theirs_m[op])]
        for op in operations
    ]
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    report = (
        "# DjangoSaver vs PostgresSaver\n\n"
        f"`python bench/langgraph_bench.py --rounds {args.rounds} --checkpoints "
        f"{args.checkpoints}`: median of {args.rounds} interleaved rounds (each the median of up "
        f"to {args.count} calls), milliseconds per call; a thread of {args.checkpoints} "
        f"checkpoints for get_tuple and list. Load average at the end: {load}.\n\n"
        + markdown_table(
            ["operation", "DjangoSaver (ms)", "PostgresSaver (ms)", "ours / theirs"], rows
        )
        + "\n"
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "langgraph.md").write_text(report)
    print(report)
    conn.close()


if __name__ == "__main__":
    main()
