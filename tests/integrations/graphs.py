"""Helpers for the LangGraph tests: real graphs, and async runs that leave no connection open."""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Coroutine
from typing import Annotated, Any, TypedDict, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections

T = TypeVar("T")


def run_async(coroutine: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` that closes, at the end, the connection the ORM's worker thread opened
    (else the test database cannot be dropped)."""

    async def run() -> T:
        try:
            return await coroutine
        finally:
            await sync_to_async(connections.close_all)()

    return asyncio.run(run())


class Trip(TypedDict):
    """The state of a small planning graph: steps append to ``log``, a human approves."""

    log: Annotated[list[str], operator.add]
    approved: bool


def planning_graph(checkpointer, *, store=None):
    """plan -> approve (interrupts for a human's answer) -> book; compiled with ``checkpointer``."""
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    def plan(state: Trip) -> dict:
        return {"log": ["planned"]}

    def approve(state: Trip) -> dict:
        answer = interrupt({"question": "book it?", "so_far": state["log"]})
        return {"approved": answer == "yes", "log": [f"human said {answer}"]}

    def book(state: Trip) -> dict:
        return {"log": ["booked" if state["approved"] else "cancelled"]}

    builder = StateGraph(Trip)
    builder.add_node("plan", plan)
    builder.add_node("approve", approve)
    builder.add_node("book", book)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "approve")
    builder.add_edge("approve", "book")
    builder.add_edge("book", END)
    return builder.compile(checkpointer=checkpointer, store=store)
