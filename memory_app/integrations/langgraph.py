"""LangGraph's checkpointer and store over Django models of this app.

    from langgraph.graph import StateGraph
    from memory_app.integrations.langgraph import DjangoSaver, DjangoStore

    graph = builder.compile(
        checkpointer=DjangoSaver(owner=request.user, namespace="planner"),
        store=DjangoStore(owner=request.user),
    )
    graph.invoke(inputs, {"configurable": {"thread_id": "trip-42"}})

``DjangoSaver`` keeps a thread's checkpoints under the session whose key is the thread id (for
its owner and namespace), so everything the app does for sessions covers them: another owner's
thread is not found, namespace retention expires and prunes them (``max_checkpoints``),
``erase_owner`` and session deletes remove them, encryption at rest covers channel values and
pending writes, and the admin lists them. It implements every method of LangGraph's
``BaseCheckpointSaver``, sync and async, including ``delete_for_runs``, ``copy_thread`` and
``prune``.

LangGraph's serialiser (``serde``) turns channel values into bytes here; the store below
(``memory_app.store.checkpoints``) stores those bytes and the checkpoint's JSON, checked by the
rule book: a config without a ``thread_id``, an id too long, metadata that is not JSON raise
``InvalidCheckpoint`` before anything is written.

``DeltaChannel`` (beta in LangGraph) is not special-cased: ``prune`` keeps whole checkpoints,
and a graph using delta channels should prune with ``keep`` larger than its snapshot frequency.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import Any

from asgiref.sync import sync_to_async

from ..aio import run_write, worker_thread_connection
from ..exceptions import InvalidCheckpoint, InvalidItem
from ..models import Item as StoredItem
from ..services import items
from ..store import checkpoints
from ..store import items as item_store
from ..types import StoredCheckpoint
from ..validation import (
    check_channel,
    check_checkpoint,
    check_checkpoint_ref,
    check_count,
    check_item_namespace,
    check_thread_id,
    check_write,
    unstorable,
)

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        BaseCheckpointSaver,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        get_checkpoint_id,
        get_serializable_checkpoint_metadata,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
    from langgraph.store.base import (
        BaseStore,
        GetOp,
        IndexConfig,
        InvalidNamespaceError,
        Item,
        ListNamespacesOp,
        NotProvided,
        Op,
        PutOp,
        Result,
        SearchItem,
        SearchOp,
        TTLConfig,
        ensure_embeddings,
        get_text_at_path,
        tokenize_path,
    )
except ImportError as err:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "memory_app.integrations.langgraph needs LangGraph: "
        "pip install 'django-memory-app[langgraph]'"
    ) from err

__all__ = ["DEFAULT_NAMESPACE", "DjangoSaver", "DjangoStore", "InvalidNamespace"]

#: Namespace of the sessions a saver keeps threads in when none is given.
DEFAULT_NAMESPACE = "langgraph"
#: Checkpoints read per query by ``list`` without a limit.
LIST_PAGE = 100
PRUNE_STRATEGIES = {"keep_latest": 1, "delete": 0}


class DjangoSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer whose threads are sessions of ``owner`` in ``namespace``.

    ``owner`` is a user (or its primary key), or ``None`` for ownerless threads; a saver sees
    only its owner's threads. Safe to share between threads and event loops: every call opens
    its own database work.
    """

    def __init__(
        self,
        *,
        owner: Any = None,
        namespace: str = DEFAULT_NAMESPACE,
        serde: SerializerProtocol | None = None,
    ) -> None:
        super().__init__(serde=serde)
        self.owner = owner
        self.namespace = namespace

    def __repr__(self) -> str:
        owner = getattr(self.owner, "pk", self.owner)
        return f"<DjangoSaver owner={owner!r} namespace={self.namespace!r}>"

    # -- config and values -------------------------------------------------------------------
    @staticmethod
    def _configurable(config: Any) -> dict[str, Any]:
        configurable = config.get("configurable") if isinstance(config, dict) else None
        if not isinstance(configurable, dict):
            raise InvalidCheckpoint("config", "must be a dict with a 'configurable' dict")
        return configurable

    def _ref(self, config: Any) -> tuple[str, str, str | None]:
        """``(thread_id, checkpoint_ns, checkpoint_id or None)`` of a config, checked."""
        configurable = self._configurable(config)
        thread_id = check_thread_id(configurable.get("thread_id"))
        ns, checkpoint_id = check_checkpoint_ref(
            configurable.get("checkpoint_ns", ""), get_checkpoint_id(config)
        )
        return thread_id, ns, checkpoint_id

    def _threads(self):
        return checkpoints.threads(self.owner, self.namespace)

    def _query(self, **filters: Any) -> list[StoredCheckpoint]:
        """``checkpoints.query`` over this saver's threads: one thread's in one statement."""
        if "thread_id" in filters:
            return checkpoints.query_thread(self.owner, self.namespace, **filters)
        return checkpoints.query(self._threads(), **filters)

    def _iter_query(self, *, page: int, **filters: Any) -> Iterator[StoredCheckpoint]:
        if "thread_id" in filters:
            return checkpoints.iter_query_thread(self.owner, self.namespace, page=page, **filters)
        return checkpoints.iter_query(self._threads(), page=page, **filters)

    def _session(self, thread_id: str, *, create: bool = False):
        return checkpoints.thread_session(self.owner, self.namespace, thread_id, create=create)

    def _tuple(self, stored: StoredCheckpoint) -> CheckpointTuple:
        loads = self.serde.loads_typed
        checkpoint = {
            **stored.checkpoint,
            "channel_values": {channel: loads(typed) for channel, typed in stored.values.items()},
        }

        def config_of(checkpoint_id: str) -> RunnableConfig:
            return {
                "configurable": {
                    "thread_id": stored.thread_id,
                    "checkpoint_ns": stored.checkpoint_ns,
                    "checkpoint_id": checkpoint_id,
                }
            }

        return CheckpointTuple(
            config=config_of(stored.checkpoint_id),
            checkpoint=checkpoint,
            metadata=stored.metadata,
            parent_config=(
                config_of(stored.parent_checkpoint_id) if stored.parent_checkpoint_id else None
            ),
            pending_writes=[
                (task_id, channel, loads((kind, data)))
                for task_id, channel, kind, data in stored.writes
            ],
        )

    def _list_filters(self, config: Any, filter: Any, before: Any, limit: Any) -> dict[str, Any]:
        filters: dict[str, Any] = {}
        if config is not None:
            configurable = self._configurable(config)
            if configurable.get("thread_id") is not None:
                filters["thread_id"] = check_thread_id(configurable["thread_id"])
            if "checkpoint_ns" in configurable:
                filters["checkpoint_ns"] = check_checkpoint_ref(configurable["checkpoint_ns"])[0]
            if (checkpoint_id := get_checkpoint_id(config)) is not None:
                filters["checkpoint_id"] = check_checkpoint_ref("", checkpoint_id)[1]
        if filter:
            if not isinstance(filter, dict):
                raise InvalidCheckpoint("filter", "must be a dict of metadata keys and values")
            if problem := unstorable(filter):
                raise InvalidCheckpoint("filter", problem)
            filters["metadata"] = filter
        if before is not None:
            self._configurable(before)
            if (before_id := get_checkpoint_id(before)) is not None:
                filters["before"] = check_checkpoint_ref("", before_id)[1]
        if limit is not None:
            filters["limit"] = check_count(limit, "limit")
        return filters

    # -- the saver's sync methods --------------------------------------------------------------
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread_id, ns, checkpoint_id = self._ref(config)
        with worker_thread_connection():
            found = checkpoints.get(
                self.owner, self.namespace, thread_id, checkpoint_ns=ns, checkpoint_id=checkpoint_id
            )
        return self._tuple(found) if found else None

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        filters = self._list_filters(config, filter, before, limit)
        with worker_thread_connection():
            found = list(self._iter_query(page=LIST_PAGE, **filters))
        for stored in found:
            yield self._tuple(stored)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        thread_id, ns, parent_id = self._ref(config)
        stored = dict(checkpoint)
        channel_values = stored.pop("channel_values", None) or {}
        stored, stored_metadata, run_id = check_checkpoint(
            stored, dict(get_serializable_checkpoint_metadata(config, metadata))
        )
        values = []
        for channel, version in new_versions.items():
            check_channel(channel)
            if channel in channel_values:
                kind, data = self.serde.dumps_typed(channel_values[channel])
            else:
                kind, data = checkpoints.EMPTY, None
            values.append((channel, str(version), kind, data))
        with worker_thread_connection():
            checkpoints.put(
                self.owner,
                self.namespace,
                thread_id,
                checkpoint_ns=ns,
                checkpoint=stored,
                metadata=stored_metadata,
                run_id=run_id,
                parent_checkpoint_id=parent_id or "",
                values=values,
            )
        return {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        thread_id, ns, checkpoint_id = self._ref(config)
        if checkpoint_id is None:
            raise InvalidCheckpoint("checkpoint_id", "writes belong to a checkpoint: name it")
        rows = []
        for idx, (channel, value) in enumerate(writes):
            check_write(task_id, task_path, channel)
            rows.append((WRITES_IDX_MAP.get(channel, idx), channel, *self.serde.dumps_typed(value)))
        with worker_thread_connection():
            checkpoints.put_writes(
                self.owner,
                self.namespace,
                thread_id,
                checkpoint_ns=ns,
                checkpoint_id=checkpoint_id,
                task_id=task_id,
                task_path=task_path,
                writes=rows,
                replace=all(channel in WRITES_IDX_MAP for channel, _ in writes),
            )

    def delete_thread(self, thread_id: str) -> None:
        thread_id = check_thread_id(thread_id)
        with worker_thread_connection():
            if (session_id := self._session(thread_id)) is not None:
                checkpoints.delete([session_id])

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        run_ids = [str(r) for r in run_ids]
        with worker_thread_connection():
            checkpoints.delete_for_runs(self._threads(), run_ids)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        source = check_thread_id(source_thread_id)
        target = check_thread_id(target_thread_id)
        with worker_thread_connection():
            if (source_id := self._session(source)) is None:
                return
            checkpoints.copy(source_id, self._session(target, create=True))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        if strategy not in PRUNE_STRATEGIES:
            raise InvalidCheckpoint(
                "strategy", f"must be one of {', '.join(PRUNE_STRATEGIES)}, not {strategy!r}"
            )
        keys = [check_thread_id(t) for t in thread_ids]
        if not keys:
            return
        with worker_thread_connection():
            ids = list(self._threads().filter(key__in=keys).values_list("pk", flat=True))
            checkpoints.prune(ids, keep=PRUNE_STRATEGIES[strategy])

    def get_next_version(self, current: str | int | None, channel: None = None) -> str:
        """Versions that sort as strings: a zero-padded counter, then a random fraction, so two
        forks of one checkpoint never hand out the same version."""
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"

    # -- async twins (the ORM is synchronous: run in a thread, as Django's async ORM does) ------
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await sync_to_async(self.get_tuple)(config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        filters = self._list_filters(config, filter, before, limit)
        remaining = filters.pop("limit", None)
        before_id = filters.pop("before", None)
        while remaining is None or remaining > 0:
            size = LIST_PAGE if remaining is None else min(LIST_PAGE, remaining)
            page = await sync_to_async(self._query)(before=before_id, limit=size, **filters)
            for stored in page:
                yield self._tuple(stored)
            if len(page) < size:
                return
            before_id = page[-1].checkpoint_id
            if remaining is not None:
                remaining -= len(page)

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await run_write(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await run_write(self.put_writes, config, list(writes), task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await run_write(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await run_write(self.delete_for_runs, list(run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await run_write(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await run_write(self.prune, list(thread_ids), strategy=strategy)


# ---- the store: an owner's items ---------------------------------------------------------------
class InvalidNamespace(InvalidItem, InvalidNamespaceError):
    """The rule book's ``InvalidItem`` for a namespace, also LangGraph's ``InvalidNamespaceError``
    so code written for LangGraph's stores catches it as it would theirs."""


class _IndexEmbedder:
    """A LangGraph ``index`` config's embeddings as the items service embeds with."""

    def __init__(self, embeddings: Any, dims: int) -> None:
        self.embeddings = embeddings
        self.name = f"langgraph:{type(embeddings).__name__}:{dims}"

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [list(map(float, v)) for v in self.embeddings.embed_documents(list(texts))]

    def embed_query(self, text: str) -> list[float]:
        return list(map(float, self.embeddings.embed_query(text)))


class DjangoStore(BaseStore):
    """LangGraph's ``BaseStore`` over an owner's items (``memory_app.models.Item``).

    ``search(..., query=...)`` ranks by the app's hybrid recall (vector similarity and full text,
    fused as ``FUSION`` says) with the configured embedder, or with the embeddings of an
    ``index`` config (``{"dims": ..., "embed": ..., "fields": [...]}``) when one is given;
    ``fields`` (default ``["$"]``, the whole value) say what text is indexed, and a put's own
    ``index`` overrides them (``False``: not searchable by query). ``filter`` takes values or
    ``$eq/$ne/$gt/$gte/$lt/$lte`` conditions on top-level value keys.

    TTLs are minutes (``ttl`` config: ``default_ttl``, ``refresh_on_read``). An expired item is
    never read, swept or not; ``sweep_ttl()`` (and the retention task) deletes them.
    """

    supports_ttl = True

    def __init__(
        self,
        *,
        owner: Any = None,
        index: IndexConfig | None = None,
        ttl: TTLConfig | None = None,
        mode: str | None = None,
    ) -> None:
        self.owner = owner
        self.ttl_config = ttl
        self.mode = mode
        self.index_config = dict(index) if index else None
        self._embedder = None
        self._fields: list[str] = ["$"]
        if index:
            embeddings = ensure_embeddings(index.get("embed"))
            self.index_config["embed"] = embeddings
            self._embedder = _IndexEmbedder(embeddings, index.get("dims", 0))
            self._fields = list(index.get("fields") or ["$"])

    def __repr__(self) -> str:
        return f"<DjangoStore owner={getattr(self.owner, 'pk', self.owner)!r}>"

    # -- ops -------------------------------------------------------------------------------------
    @staticmethod
    def _check(op: Op) -> None:
        """The rule book's namespace checks, before anything in a batch runs."""
        try:
            if isinstance(op, (GetOp, PutOp)):
                check_item_namespace(op.namespace)
            elif isinstance(op, SearchOp):
                check_item_namespace(op.namespace_prefix, field="namespace_prefix", empty=True)
            elif isinstance(op, ListNamespacesOp):
                for condition in op.match_conditions or ():
                    check_item_namespace(condition.path, field="namespace", wildcard=True)
            else:
                raise InvalidItem("op", f"unknown store operation {type(op).__name__}")
        except InvalidItem as err:
            if err.field in ("namespace", "namespace_prefix"):
                raise InvalidNamespace(err.field, err.reason) from None
            raise

    def _text(self, value: dict, index: Any) -> str | None:
        if index is False:
            return None
        paths = self._fields if index is None else list(index)
        texts = []
        for path in paths:
            texts += get_text_at_path(value, path if path == "$" else tokenize_path(path))
        return "\n".join(t for t in texts if t) or None

    def _ttl(self, ttl: Any) -> Any:
        if isinstance(ttl, NotProvided):
            return (self.ttl_config or {}).get("default_ttl")
        return ttl  # checked by the rule book

    def _refresh(self, refresh_ttl: bool | None) -> bool:
        if refresh_ttl is not None:
            return refresh_ttl
        return (self.ttl_config or {}).get("refresh_on_read", True)

    @staticmethod
    def _item(stored: StoredItem, score: float | None = None, *, searched: bool = False) -> Item:
        fields = {
            "value": stored.value,
            "key": stored.key,
            "namespace": item_store.split(stored.namespace),
            "created_at": stored.created_at,
            "updated_at": stored.updated_at,
        }
        return SearchItem(**fields, score=score) if searched else Item(**fields)

    def _run(self, op: Op) -> Result:
        if isinstance(op, GetOp):
            found = items.get(
                self.owner, op.namespace, op.key, refresh=self._refresh(op.refresh_ttl)
            )
            return None if found is None else self._item(found)
        if isinstance(op, PutOp):
            if op.value is None:
                items.delete(self.owner, op.namespace, op.key)
                return None
            value = dict(op.value) if isinstance(op.value, dict) else op.value
            text = self._text(value, op.index) if isinstance(value, dict) else None
            items.put(
                self.owner,
                op.namespace,
                op.key,
                value,
                ttl=self._ttl(op.ttl),
                text=text,
                embedder=self._embedder,
            )
            return None
        if isinstance(op, SearchOp):
            found = items.search(
                self.owner,
                op.namespace_prefix,
                query=op.query,
                filter=op.filter,
                limit=op.limit,
                offset=op.offset,
                refresh=self._refresh(op.refresh_ttl),
                mode=self.mode,
                embedder=self._embedder,
            )
            return [self._item(item, score, searched=True) for item, score in found]
        conditions = [
            (c.match_type, (c.path,) if isinstance(c.path, str) else tuple(c.path))
            for c in op.match_conditions or ()
        ]
        return items.list_namespaces(
            self.owner, conditions, max_depth=op.max_depth, limit=op.limit, offset=op.offset
        )

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        for op in ops:
            self._check(op)
        with worker_thread_connection():
            return [self._run(op) for op in ops]

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        if any(isinstance(op, PutOp) for op in ops):
            return await run_write(self.batch, ops)
        return await sync_to_async(self.batch)(ops)

    def sweep_ttl(self) -> int:
        """Delete expired items (of every owner); returns how many."""
        return item_store.sweep_expired()

    async def asweep_ttl(self) -> int:
        return await run_write(self.sweep_ttl)
