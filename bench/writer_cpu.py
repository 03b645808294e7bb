"""Which CPU limits 16 concurrent writers: throughput with each CPU's busy share beside it.

    python bench/writer_cpu.py --cpus apart   # this process on one CPU, the server on another
    python bench/writer_cpu.py --cpus same    # both on one CPU
    python bench/writer_cpu.py                # where the OS puts them

16 threads append to 16 sessions of their own (``--appends`` each), memory_app (the store
benchmark's settings: the store alone) and langchain-postgres taking turns for ``--rounds``
rounds; ``/proc/stat`` is read around each round. Pinned apart, the busy share says whose work
limits a store: the client's CPU (its Python and driver) or the server's (its statements and
their indexes, and for memory_app the after-append job's full-text vectors). ``synchronous_commit=off``
as in ``store_bench.py``. Linux only. Writes ``bench/results/writer_cpu*.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    RESULTS,
    add_cpus_argument,
    cpu_placement,
    cpus_option,
    markdown_table,
    results_suffix,
    setup_django,
)
from bench.store_bench import STORE_ONLY, make_messages  # noqa: E402

WRITERS = 16


def cpu_times() -> dict[str, tuple[int, int]]:
    """Per CPU: (all jiffies, idle and iowait jiffies) since boot."""
    times = {}
    with open("/proc/stat") as stat:
        for line in stat:
            if line.startswith("cpu") and line[3].isdigit():
                name, *values = line.split()
                numbers = [int(v) for v in values[:8]]
                times[name] = (sum(numbers), numbers[3] + numbers[4])
    return times


def busy_share(before, after) -> dict[str, float]:
    return {
        cpu: 1 - (after[cpu][1] - before[cpu][1]) / max(1, after[cpu][0] - before[cpu][0])
        for cpu in before
    }


def one_round(appenders, messages, appends: int) -> tuple[float, dict[str, float]]:
    """All writers start together; messages per second, and each CPU's busy share."""
    start = threading.Barrier(len(appenders) + 1)

    def write(append) -> None:
        start.wait()
        for i in range(appends):
            append(messages[i % len(messages)])

    threads = [threading.Thread(target=write, args=(a,)) for a in appenders]
    for thread in threads:
        thread.start()
    before = cpu_times()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    return len(appenders) * appends / elapsed, busy_share(before, cpu_times())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_cpus_argument(parser)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--appends", type=int, default=200, help="appends per writer a round")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_DEBUG", "0")  # DEBUG keeps a log of every query
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    settings_dict = setup_django(memory_app=STORE_ONLY)
    from django.db import connection

    from bench.stores import LangchainStore, commit_setting
    from memory_app import Memory
    from memory_app.services import background

    connection.close()
    options = connection.settings_dict.setdefault("OPTIONS", {})
    options.update(options=commit_setting(False), prepare_threshold=5)
    messages = make_messages(512, seed=7, system=False)

    def ours():
        memory = Memory.session(f"writer-cpu-{uuid.uuid4().hex}", namespace="bench")
        return lambda m: memory.add({"role": m["role"], "content": m["content"]})

    peers = []

    def langchain():
        store = LangchainStore()
        store.setup(settings_dict)  # a connection per writer
        peers.append(store)
        session = store.session(f"writer-cpu-{uuid.uuid4().hex}")
        return lambda m: store.append(session, m)

    stores = {"memory_app (store alone)": ours, "langchain-postgres": langchain}
    rows = []
    with cpu_placement(settings_dict, args.cpus) as placement:
        for round_no in range(args.rounds):
            order = list(stores.items())
            for name, make in order[round_no % 2 :] + order[: round_no % 2]:
                rate, busy = one_round([make() for _ in range(WRITERS)], messages, args.appends)
                background.wait_for_deferred()  # our after-append jobs, outside the next turn
                for store in peers:
                    store.close()
                peers.clear()
                shares = ", ".join(f"{cpu} {share:.0%}" for cpu, share in sorted(busy.items()))
                rows.append((str(round_no + 1), name, f"{rate:,.0f}", shares))
    table = markdown_table(["round", "store", "messages/s", "busy share of each CPU"], rows)
    option = cpus_option(args.cpus)
    text = (
        "# Which CPU limits 16 writers on 16 sessions\n\n"
        f"{table}\n\n"
        f"{WRITERS} threads, {args.appends} appends each a round, a session each; this process "
        f"and the database server {placement}. With `--cpus apart` the first CPU is this "
        "process's and the second the server's. Machine: "
        f"{os.cpu_count()} cores; load average at start {load}.\n\n"
        f"Reproduce: `python bench/writer_cpu.py{option}`\n"
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"writer_cpu{results_suffix(option)}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
