"""A LangGraph graph that pauses for a human and resumes in another process, its state kept in
the Django database by DjangoSaver, a fact kept in DjangoStore.

    python examples/langgraph_thread.py start     # plans, then waits for approval
    python examples/langgraph_thread.py approve   # a new process resumes the same thread
    python examples/langgraph_thread.py history   # the thread's checkpoints, newest first

No model is needed: the nodes are plain functions. Options: ``--thread ID`` (default
``trip-demo``). See ``_setup.py`` for the database.
"""

from __future__ import annotations

import argparse
import operator
from typing import Annotated, TypedDict

from _setup import setup_django


class Trip(TypedDict):
    log: Annotated[list[str], operator.add]
    approved: bool


def build_graph():
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    from memory_app.integrations.langgraph import DjangoSaver, DjangoStore

    def plan(state: Trip, *, store) -> dict:
        diet = store.get(("prefs",), "diet")
        return {"log": [f"planned (diet: {diet.value['text'] if diet else 'any'})"]}

    def approve(state: Trip) -> dict:
        answer = interrupt({"question": "Book it?", "plan": state["log"]})
        return {"approved": answer == "yes", "log": [f"human said {answer}"]}

    def book(state: Trip) -> dict:
        return {"log": ["booked" if state["approved"] else "cancelled"]}

    builder = StateGraph(Trip)
    for name, node in (("plan", plan), ("approve", approve), ("book", book)):
        builder.add_node(name, node)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "approve")
    builder.add_edge("approve", "book")
    builder.add_edge("book", END)
    store = DjangoStore(owner=None)
    store.put(("prefs",), "diet", {"text": "vegetarian"})
    return builder.compile(checkpointer=DjangoSaver(namespace="examples"), store=store)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["start", "approve", "reject", "history"])
    parser.add_argument("--thread", default="trip-demo")
    args = parser.parse_args()
    setup_django()
    from langgraph.types import Command

    graph = build_graph()
    config = {"configurable": {"thread_id": args.thread}}
    if args.action == "start":
        result = graph.invoke({"log": [], "approved": False}, config)
        print("paused:", result["__interrupt__"][0].value["question"])
    elif args.action in ("approve", "reject"):
        result = graph.invoke(Command(resume="yes" if args.action == "approve" else "no"), config)
        print(" -> ".join(result["log"]))
    else:
        for state in graph.get_state_history(config):
            print(state.config["configurable"]["checkpoint_id"], state.next, state.values["log"])


if __name__ == "__main__":
    main()
