"""Writes from async code that a cancellation cannot cut loose from their outcome.

``sync_to_async`` runs the ORM on a worker thread; cancelling the awaiting task does not stop
that thread, so without care a caller is told "cancelled" while its write goes on and commits
afterwards. The frameworks' own stores keep a cancelled write's task pending until the write
has finished, then raise ``CancelledError``: the caller knows the write's fate once the task
is done (look again and the effect is either fully there or absent, never still on its way).
``run_write`` does the same for the async twins of every write (the facade, the integrations).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, Concatenate, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections

T = TypeVar("T")


async def run_write(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Run the synchronous write ``fn(*args, **kwargs)`` on a thread and return its result.

    If the caller is cancelled meanwhile (once or repeatedly), wait for the write's outcome,
    then raise the first ``CancelledError``: a write that failed is not reported as its error
    but as the cancellation the caller asked for, as the SDK stores do.
    """
    return await outlive_cancellation(sync_to_async(fn)(*args, **kwargs))


async def outlive_cancellation(write: Awaitable[T]) -> T:
    """Await ``write`` (a coroutine: a native async write) to its end even if the caller is
    cancelled meanwhile; then raise the first ``CancelledError``, as ``run_write`` does."""
    work = asyncio.ensure_future(write)
    cancelled: asyncio.CancelledError | None = None
    while not work.done():
        try:
            await asyncio.wait({work})
        except asyncio.CancelledError as err:
            cancelled = cancelled or err
    if cancelled is not None:
        if not work.cancelled():
            work.exception()  # retrieved, so asyncio does not log it as never retrieved
        raise cancelled
    return work.result()


@contextmanager
def worker_thread_connection() -> Iterator[None]:
    """Close again the database connections opened just for this call on a worker thread.

    Frameworks call a store on short-lived or pooled executor threads (LangChain's
    ``RunnableParallel``, LangGraph's background writes); Django leaves closing connections to
    code that runs queries on its own threads, so without this each call would leave a
    connection open until the thread ends.
    """
    if threading.current_thread() is threading.main_thread():
        yield
        return
    opened_before = {c.alias for c in connections.all(initialized_only=True) if c.connection}
    try:
        yield
    finally:
        for connection in connections.all(initialized_only=True):
            if (
                connection.alias not in opened_before
                and connection.connection is not None
                and not connection.in_atomic_block
            ):
                connection.close()


# ---- async twins of synchronous methods (the facade's) ------------------------------------------
P = ParamSpec("P")
R = TypeVar("R")


def twin(
    method: Callable[Concatenate[Any, P], R], *, write: bool = False
) -> Callable[Concatenate[Any, P], Awaitable[R]]:
    """The async twin of a method: the same call in a worker thread (``sync_to_async``)."""

    @functools.wraps(method)
    async def run(self: Any, *args: P.args, **kwargs: P.kwargs) -> R:
        if write:
            return await run_write(method, self, *args, **kwargs)
        return await sync_to_async(method)(self, *args, **kwargs)

    run.__name__ = run.__qualname__ = "a" + method.__name__
    return run


def static_twin(function: Callable[P, R], *, write: bool = False) -> Callable[P, Awaitable[R]]:
    @functools.wraps(function)
    async def run(*args: P.args, **kwargs: P.kwargs) -> R:
        if write:
            return await run_write(function, *args, **kwargs)
        return await sync_to_async(function)(*args, **kwargs)

    return staticmethod(run)  # type: ignore[return-value]
