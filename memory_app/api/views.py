"""The REST API views: thin HTTP shells over the adapter (``memory_app.memory``).

Each action parses its input, makes one adapter call and serialises what comes back; the
adapter's typed errors become HTTP statuses in ``memory_app.api.exceptions``. Later features add
their own ``@action`` on ``SessionViewSet`` (``sessions/{id}/search/``, ...), reusing
``get_memory()``, which resolves the session within the requester's owner scope.
"""

from __future__ import annotations

from typing import Any

from django.http import QueryDict, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
    extend_schema_view,
)
from rest_framework import filters, serializers, status
from rest_framework.decorators import action
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.viewsets import GenericViewSet, ViewSet

from ..conf import memory_settings
from ..exceptions import InvalidMessage, SessionExists
from ..memory import Memory, SessionMemory
from ..models import Session
from . import serializers as s
from .exceptions import memory_exception_handler
from .pagination import SessionCursorPagination, next_messages_link
from .parsers import MemoryJSONParser

# -- documented error responses ------------------------------------------------------------------

_ERROR = s.ErrorSerializer
AUTH_ERRORS = {
    401: OpenApiResponse(_ERROR, description="Not authenticated (token authentication)."),
    403: OpenApiResponse(
        _ERROR, description="Not authenticated (session authentication) or not allowed."
    ),
    429: OpenApiResponse(
        _ERROR, description="Throttled: retry after the Retry-After header's seconds."
    ),
    # Not about authentication, but every operation may answer it, like the ones above.
    503: OpenApiResponse(
        _ERROR,
        description="The database is unavailable (code "
        "database_unavailable): retry after Retry-After seconds.",
    ),
}
NOT_FOUND = {
    404: OpenApiResponse(
        _ERROR,
        description="No such session for this user (another owner's session is not found either).",
    ),
}
BAD_INPUT = {
    400: OpenApiResponse(
        _ERROR,
        description="Bad input: `field` (and `index` in a batch) says what and `errors` why.",
    )
}
UNSUPPORTED = {
    415: OpenApiResponse(_ERROR, description="The body must be JSON."),
    413: OpenApiResponse(
        _ERROR,
        description="The body is larger than the server accepts "
        "(Django's DATA_UPLOAD_MAX_MEMORY_SIZE).",
    ),
}
SESSION_ID = OpenApiParameter(
    "id", OpenApiTypes.UUID, OpenApiParameter.PATH, description="The session's id."
)
BLOCK_NAME = OpenApiParameter(
    "name",
    OpenApiTypes.STR,
    OpenApiParameter.PATH,
    description="The block's name: 1-64 letters, digits, '_' or '-'.",
    pattern=r"^[A-Za-z0-9_-]{1,64}$",
)
MEMORY_KEY = OpenApiParameter(
    "key", OpenApiTypes.STR, OpenApiParameter.PATH, description="The memory's key."
)


def _errors(*groups: dict) -> dict:
    merged: dict = {}
    for group in (AUTH_ERRORS, *groups):
        merged.update(group)
    return merged


def _validated(serializer_class: type[serializers.Serializer], data: Any) -> dict[str, Any]:
    if isinstance(data, QueryDict):
        # As a plain dict: DRF reads an empty form value as "not given", but `?after=` is bad input.
        data = data.dict()
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


class MemoryAPIMixin:
    """Policies shared by the memory API views: JSON only, the app's permission and throttle
    settings, the owner scope, and the one exception handler."""

    parser_classes = [MemoryJSONParser]
    renderer_classes = [JSONRenderer]

    def get_permissions(self) -> list:
        return [permission() for permission in memory_settings.API_PERMISSION_CLASSES]

    def get_throttles(self) -> list:
        return [throttle() for throttle in memory_settings.API_THROTTLE_CLASSES]

    def get_exception_handler(self):
        return memory_exception_handler

    def owner_scope(self) -> Any:
        """Whose sessions this request may see: asked of the permission classes (see
        ``memory_app.api.permissions``); the requesting user when none says."""
        for permission in self.get_permissions():
            scope = getattr(permission, "owner_scope", None)
            if scope is not None:
                return scope(self.request, self)
        return self.request.user


@extend_schema_view(
    list=extend_schema(
        summary="List sessions",
        description="Your sessions, newest first (or by `ordering`), a page at a time.",
        parameters=[s.SessionListQuerySerializer],
        responses={200: s.SessionSerializer(many=True), **_errors(BAD_INPUT)},
    ),
    create=extend_schema(
        summary="Create a session",
        description="A key is unique per owner and namespace: a taken key answers 409, unless "
        "`get_or_create` is true, which returns the existing session with 200.",
        request=s.SessionCreateSerializer,
        examples=[
            OpenApiExample(
                "A support chat",
                request_only=True,
                value={
                    "key": "chat-42",
                    "namespace": "support-bot",
                    "title": "Refund question",
                    "metadata": {"customer": "c-1001"},
                },
            )
        ],
        responses={
            201: OpenApiResponse(s.SessionSerializer, description="Created."),
            200: OpenApiResponse(
                s.SessionSerializer, description="Existing session (get_or_create)."
            ),
            409: OpenApiResponse(_ERROR, description="The key is taken (code session_exists)."),
            **_errors(BAD_INPUT, UNSUPPORTED),
        },
    ),
    retrieve=extend_schema(
        summary="Get a session",
        parameters=[SESSION_ID],
        responses={200: s.SessionSerializer, **_errors(NOT_FOUND)},
    ),
    partial_update=extend_schema(
        summary="Update a session",
        description="Only `title`, `metadata` (replaced whole) and `expires_at` may change; any "
        "other field, read-only or unknown, answers 400.",
        parameters=[SESSION_ID],
        request=s.SessionUpdateSerializer,
        examples=[OpenApiExample("Rename", request_only=True, value={"title": "Refund approved"})],
        responses={200: s.SessionSerializer, **_errors(BAD_INPUT, NOT_FOUND, UNSUPPORTED)},
    ),
    destroy=extend_schema(
        summary="Delete a session",
        description="With its messages, snapshots and embeddings.",
        parameters=[SESSION_ID],
        responses={204: None, **_errors(NOT_FOUND)},
    ),
)
class SessionViewSet(MemoryAPIMixin, GenericViewSet):
    """Sessions of the requesting user and everything under them."""

    lookup_url_kwarg = "id"
    lookup_value_regex = "[^/]+"  # any id reaches the view, which answers 404 for a bad one
    filter_backends = [filters.SearchFilter, filters.OrderingFilter]
    search_fields = ["title", "key"]
    ordering_fields = ["updated_at", "created_at"]
    ordering = ["-updated_at"]
    pagination_class = SessionCursorPagination
    serializer_class = s.SessionSerializer

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation
            return Session.objects.none()
        namespace = _validated(s.SessionListQuerySerializer, self.request.query_params).get(
            "namespace"
        )
        return Memory.sessions_queryset(self.owner_scope(), namespace=namespace)

    def get_memory(self) -> SessionMemory:
        """The session in the URL, if the requester may see it; else ``SessionNotFound`` (404)."""
        return Memory.get(self.kwargs[self.lookup_url_kwarg], owner=self.owner_scope())

    # -- sessions ---------------------------------------------------------------------------
    def list(self, request: Request) -> Response:
        queryset = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(queryset)
        return self.get_paginated_response(s.SessionSerializer(page, many=True).data)

    def create(self, request: Request) -> Response:
        data = _validated(s.SessionCreateSerializer, request.data)
        get_or_create = data.pop("get_or_create")
        try:
            memory = Memory.create(owner=request.user, **data)
        except SessionExists:
            if not get_or_create:
                raise
            memory = Memory.session(
                data["key"], owner=request.user, namespace=data.get("namespace"), create=False
            )
            return Response(s.SessionSerializer(memory.info()).data, status=status.HTTP_200_OK)
        return Response(s.SessionSerializer(memory.info()).data, status=status.HTTP_201_CREATED)

    def retrieve(self, request: Request, id: str) -> Response:
        return Response(s.SessionSerializer(self.get_memory().info()).data)

    def partial_update(self, request: Request, id: str) -> Response:
        memory = self.get_memory()
        memory.update(**_validated(s.SessionUpdateSerializer, request.data))
        return Response(s.SessionSerializer(memory.info()).data)

    def destroy(self, request: Request, id: str) -> Response:
        self.get_memory().delete()
        return Response(status=status.HTTP_204_NO_CONTENT)

    # -- the log ----------------------------------------------------------------------------
    @extend_schema(
        methods=["GET"],
        summary="Read messages",
        description="Messages with a cursor greater than `after` (and less than `before`), oldest "
        "first, `limit` at a time; follow `next` until it is null. With `before` "
        "alone the page is the `limit` messages before it and `next` pages further "
        'back. The answer has the shape `POST` answers: `{"messages", "next"}`.',
        parameters=[SESSION_ID, s.MessagesQuerySerializer],
        responses={200: s.MessagePageSerializer, **_errors(BAD_INPUT, NOT_FOUND)},
    )
    @extend_schema(
        methods=["POST"],
        summary="Append messages",
        description='One OpenAI-format message, or `{"messages": [...]}` appended atomically (all '
        "or none). Answers the stored messages with their cursors. A message whose "
        "`idempotency_key` is already stored is returned instead of stored again.",
        parameters=[SESSION_ID],
        request=PolymorphicProxySerializer(
            component_name="AppendMessages",
            serializers=[s.MessageInSerializer, s.MessageBatchInSerializer],
            resource_type_field_name=None,
        ),
        responses={201: s.AppendedMessagesSerializer, **_errors(BAD_INPUT, NOT_FOUND, UNSUPPORTED)},
        examples=[
            OpenApiExample(
                "One message", value={"role": "user", "content": "Hi"}, request_only=True
            ),
            OpenApiExample(
                "A batch",
                request_only=True,
                value={
                    "messages": [
                        {"role": "user", "content": "Weather in Oslo?"},
                        {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {
                                    "id": "call_1",
                                    "type": "function",
                                    "function": {
                                        "name": "weather",
                                        "arguments": '{"city": "Oslo"}',
                                    },
                                }
                            ],
                        },
                        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                    ]
                },
            ),
        ],
    )
    @action(detail=True, methods=["get", "post"])
    def messages(self, request: Request, id: str) -> Response:
        if request.method == "POST":
            return self._append(id, request.data)
        memory = self.get_memory()
        query = _validated(s.MessagesQuerySerializer, request.query_params)
        limit = query.get("limit") or memory_settings.API_MESSAGES_PAGE_SIZE
        after, before = query.get("after"), query.get("before")
        found = memory.messages(after=after, limit=limit + 1, before=before)
        backwards = before is not None and after is None
        page = found[-limit:] if backwards else found[:limit]
        return Response(
            {
                "messages": s.StoredMessageSerializer(page, many=True).data,
                "next": next_messages_link(
                    request,
                    page,
                    has_more=len(found) > limit,
                    limit=limit,
                    after=after,
                    before=before,
                ),
            }
        )

    def _append(self, session_id: str, data: Any) -> Response:
        # By id: the append statement checks the owner scope itself (no query to open the
        # session first); another owner's session is not found (404) all the same.
        owner = self.owner_scope()
        if isinstance(data, dict) and "messages" in data and "role" not in data:
            unknown = sorted(set(data) - {"messages"})
            if unknown:
                raise InvalidMessage(unknown[0], 'unknown field (a batch is {"messages": [...]})')
            stored = Memory.add_many(session_id, data["messages"], owner=owner)
        else:
            stored = [Memory.add(session_id, data, owner=owner)]
        # StoredMessageSerializer's representation, without building a serializer per request.
        return Response(
            {"messages": [m.as_dict() for m in stored], "next": None},
            status=status.HTTP_201_CREATED,
        )

    @extend_schema(
        summary="Context window",
        description="What to send the model next: the latest snapshot's summary and pinned "
        "messages, system messages, then the newest messages that fit the budgets "
        "(tool calls and their results are kept or dropped together).",
        parameters=[SESSION_ID, s.WindowQuerySerializer],
        responses={200: s.WindowSerializer, **_errors(BAD_INPUT, NOT_FOUND)},
    )
    @action(detail=True, methods=["get"])
    def window(self, request: Request, id: str) -> Response:
        memory = self.get_memory()
        query = _validated(s.WindowQuerySerializer, request.query_params)
        return Response(s.WindowSerializer(memory.window(**query)).data)

    # -- snapshots --------------------------------------------------------------------------
    @extend_schema(
        methods=["GET"],
        summary="Latest snapshot",
        parameters=[SESSION_ID],
        responses={
            200: s.SnapshotSerializer,
            404: OpenApiResponse(
                _ERROR, description="No such session, or it has no snapshot yet (code no_snapshot)."
            ),
            **AUTH_ERRORS,
        },
    )
    @extend_schema(
        methods=["POST"],
        summary="Save a snapshot (compare-and-swap)",
        description="Saves a summary standing for every message up to `upto`. `prev_version` is "
        "the latest version you read (omit it if there was none): if another snapshot "
        "was saved since, nothing is written and the answer is 409 with the current "
        "snapshot. `upto` must move past the previous snapshot and lie within the log.",
        parameters=[SESSION_ID],
        request=s.SnapshotCreateSerializer,
        examples=[
            OpenApiExample(
                "First snapshot",
                request_only=True,
                value={
                    "summary": "The user asked about the weather in Oslo; it is sunny.",
                    "upto": 2,
                    "pinned": [{"role": "user", "content": "Task: plan a day in Oslo."}],
                },
            ),
            OpenApiExample(
                "Next snapshot",
                request_only=True,
                value={
                    "summary": "Weather checked; the user now plans a museum visit.",
                    "upto": 4,
                    "prev_version": 1,
                },
            ),
        ],
        responses={
            201: s.SnapshotSerializer,
            409: OpenApiResponse(
                s.SnapshotConflictSerializer,
                description="Another snapshot was saved since `prev_version`.",
            ),
            **_errors(BAD_INPUT, NOT_FOUND, UNSUPPORTED),
        },
    )
    @action(detail=True, methods=["get", "post"])
    def snapshot(self, request: Request, id: str) -> Response:
        memory = self.get_memory()
        if request.method == "POST":
            data = _validated(s.SnapshotCreateSerializer, request.data)
            saved = memory.save_snapshot(
                data.pop("summary"),
                upto=data.pop("upto"),
                prev=data.pop("prev_version", None),
                **data,
            )
            return Response(s.SnapshotSerializer(saved).data, status=status.HTTP_201_CREATED)
        latest = memory.latest_snapshot()
        if latest is None:
            return Response(
                {"detail": "This session has no snapshot yet.", "code": "no_snapshot"},
                status=status.HTTP_404_NOT_FOUND,
            )
        return Response(s.SnapshotSerializer(latest).data)

    # -- recall and summarization -----------------------------------------------------------
    @extend_schema(
        summary="Search messages",
        description="Messages matching `q`, best first, each with its score, cursor, session id "
        "and the message in OpenAI form (never its embedding). `scope=owner` searches "
        "every session of this session's owner: yours (staff allowed to see other "
        "owners' sessions search that owner's). A bad parameter is 400 "
        "(`invalid_search` or `invalid`) with `field` naming it.",
        parameters=[SESSION_ID, s.SearchQuerySerializer],
        responses={200: s.SearchResultsSerializer, **_errors(BAD_INPUT, NOT_FOUND)},
    )
    @action(detail=True, methods=["get"])
    def search(self, request: Request, id: str) -> Response:
        memory = self.get_memory()
        query = _validated(s.SearchQuerySerializer, request.query_params)
        results = memory.search(query.pop("q"), **query)
        return Response({"results": s.SearchResultSerializer(results, many=True).data})

    @extend_schema(
        summary="Summarize in the background",
        description="Enqueues the summarize_session task, which saves a snapshot covering all but "
        "the newest `keep_recent` messages (nothing when there is nothing to cover). "
        "Answers 202 with the task's id; without a broker the task has already run.",
        parameters=[SESSION_ID],
        request=s.SummarizeSerializer,
        examples=[OpenApiExample("Keep the last 10", request_only=True, value={"keep_recent": 10})],
        responses={202: s.TaskSerializer, **_errors(BAD_INPUT, NOT_FOUND, UNSUPPORTED)},
    )
    @action(detail=True, methods=["post"])
    def summarize(self, request: Request, id: str) -> Response:
        memory = self.get_memory()
        data = _validated(s.SummarizeSerializer, request.data)
        scheduled = memory.schedule_summary(keep_recent=data.get("keep_recent"))
        if scheduled.state == "failed":
            return Response(
                {
                    "detail": f"Summarization could not be scheduled: {scheduled.error}",
                    "code": "broker_unavailable",
                },
                status=status.HTTP_503_SERVICE_UNAVAILABLE,
                headers={"Retry-After": "5"},
            )
        return Response(
            {"task_id": scheduled.task_id, "state": scheduled.state},
            status=status.HTTP_202_ACCEPTED,
        )

    @extend_schema(
        summary="Context with recall",
        description="The window (as `window/`) plus up to `recall_k` older messages relevant to "
        "`q`, all within `max_tokens`. Recalled messages appear only inside ONE "
        "system message that labels them untrusted reference data (its cursor is "
        "null), never as instructions.",
        parameters=[SESSION_ID, s.ContextQuerySerializer],
        responses={200: s.ContextSerializer, **_errors(BAD_INPUT, NOT_FOUND)},
    )
    @action(detail=True, methods=["get"])
    def context(self, request: Request, id: str) -> Response:
        memory = self.get_memory()
        query = _validated(s.ContextQuerySerializer, request.query_params)
        return Response(s.ContextSerializer(memory.context(query.pop("q", None), **query)).data)

    # -- whole-session operations -----------------------------------------------------------
    @extend_schema(
        summary="Export a session",
        description="The whole session as lossless JSON (messages with cursors, snapshots, "
        "metadata); POST it to `sessions/import/` to restore it.",
        parameters=[SESSION_ID],
        responses={200: s.SessionExportSerializer, **_errors(NOT_FOUND)},
    )
    @action(detail=True, methods=["get"])
    def export(self, request: Request, id: str) -> Response:
        return Response(s.SessionExportSerializer(self.get_memory().export()).data)

    @extend_schema(
        summary="Import a session",
        description="Restores an export as a new session of yours, with the same cursors, "
        "snapshots and metadata. `?key=` / `?namespace=` store it under another name.",
        parameters=[s.ImportQuerySerializer],
        request=s.SessionExportSerializer,
        responses={
            201: s.SessionSerializer,
            409: OpenApiResponse(_ERROR, description="The key is taken (code session_exists)."),
            **_errors(BAD_INPUT, UNSUPPORTED),
        },
    )
    @action(detail=False, methods=["post"], url_path="import", url_name="import")
    def import_session(self, request: Request) -> Response:
        query = _validated(s.ImportQuerySerializer, request.query_params)
        memory = Memory.import_session(request.data, owner=request.user, **query)
        return Response(s.SessionSerializer(memory.info()).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        summary="Clear a session",
        description="Removes its messages, snapshots, embeddings and metadata; the session stays "
        "and new messages get new cursors (cursors are never reused).",
        parameters=[SESSION_ID],
        request=None,
        responses={200: s.SessionSerializer, **_errors(NOT_FOUND)},
    )
    @action(detail=True, methods=["post"])
    def clear(self, request: Request, id: str) -> Response:
        memory = self.get_memory()
        memory.clear()
        return Response(s.SessionSerializer(memory.info()).data)

    # -- memory blocks of one session -------------------------------------------------------
    @extend_schema(
        summary="The session's memory blocks",
        description="The blocks every window of this session carries: its owner's, then its own.",
        parameters=[SESSION_ID],
        responses={200: s.BlockSerializer(many=True), **_errors(NOT_FOUND)},
    )
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def blocks(self, request: Request, id: str) -> Response:
        return Response(s.BlockSerializer(self.get_memory().blocks(), many=True).data)

    @extend_schema(
        methods=["PUT"],
        summary="Write a block of the session",
        description="Replaces the block's text (or appends a line with `append`), creating it. "
        "A text past MEMORY_BLOCK_MAX_CHARS is 400, never cut.",
        parameters=[SESSION_ID, BLOCK_NAME],
        request=s.BlockWriteSerializer,
        responses={200: s.BlockSerializer, **_errors(BAD_INPUT, NOT_FOUND, UNSUPPORTED)},
    )
    @extend_schema(
        methods=["DELETE"],
        summary="Delete a block of the session",
        parameters=[SESSION_ID, BLOCK_NAME],
        responses={204: None, **_errors(BAD_INPUT, NOT_FOUND)},
    )
    @action(detail=True, methods=["put", "delete"], url_path=r"blocks/(?P<name>[^/]+)")
    def block(self, request: Request, id: str, name: str) -> Response:
        learned = self.get_memory().learned
        if request.method == "DELETE":
            if not learned.delete_block(name, scope="session"):
                return _no_block(name)
            return Response(status=status.HTTP_204_NO_CONTENT)
        data = _validated(s.BlockWriteSerializer, request.data)
        block = learned.write_block(name, data["text"], scope="session", append=data["append"])
        return Response(s.BlockSerializer(block).data)


NO_ROUTE = {404: OpenApiResponse(_ERROR, description="No such route (an empty name, say).")}


def _no_block(name: str) -> Response:
    return Response(
        {"detail": f"No memory block {name!r}.", "code": "not_found"},
        status=status.HTTP_404_NOT_FOUND,
    )


# -- learned memory: the requesting user's facts and blocks (memory_app.learned) -------------------
@extend_schema_view(
    list=extend_schema(
        summary="Your memories",
        description="Facts learned about you, in force now (or at `as_of`): newest first, or "
        "ranked by `q`. `filters` narrows them (metadata, creation time, source session).",
        parameters=[s.MemoryQuerySerializer],
        responses={200: s.MemorySerializer(many=True), **_errors(BAD_INPUT)},
    ),
    create=extend_schema(
        summary="Remember a fact",
        description="Keeps a fact (importance 1 unless given). The same fact already kept is "
        "confirmed instead (200 with it); a new one is 201.",
        request=s.MemoryWriteSerializer,
        responses={
            201: s.MemorySerializer,
            200: OpenApiResponse(s.MemorySerializer, description="Already kept: confirmed."),
            **_errors(BAD_INPUT, UNSUPPORTED),
        },
    ),
    retrieve=extend_schema(
        operation_id="memory_memories_history",
        summary="A memory's history",
        description="Every version of the memory, oldest first, with why each ended.",
        parameters=[MEMORY_KEY],
        responses={200: s.MemorySerializer(many=True), **_errors(NOT_FOUND)},
    ),
    partial_update=extend_schema(
        summary="Update a memory",
        description="A new version in force from now; the old one stays in the history.",
        parameters=[MEMORY_KEY],
        request=s.MemoryWriteSerializer,
        responses={200: s.MemorySerializer, **_errors(BAD_INPUT, NOT_FOUND, UNSUPPORTED)},
    ),
    destroy=extend_schema(
        summary="Forget a memory",
        description="Ends the memory; its history stays readable.",
        parameters=[MEMORY_KEY],
        responses={204: None, **_errors(NOT_FOUND)},
    ),
)
class MemoryViewSet(MemoryAPIMixin, ViewSet):
    """Facts learned about the requesting user. Always the requester's own, for staff too."""

    lookup_field = "key"
    lookup_value_regex = r"[^/]+"

    def list(self, request: Request) -> Response:
        query = _validated(s.MemoryQuerySerializer, request.query_params)
        learned = Memory.learned(request.user)
        if "q" in query:
            found = learned.search(
                query["q"],
                limit=query["limit"],
                as_of=query.get("as_of"),
                filters=query.get("filters"),
            )
        else:
            found = learned.current(
                as_of=query.get("as_of"),
                filters=query.get("filters"),
                limit=query["limit"],
                offset=query["offset"],
            )
        return Response(s.MemorySerializer(found, many=True).data)

    def create(self, request: Request) -> Response:
        data = _validated(s.MemoryWriteSerializer, request.data)
        memory = Memory.learned(request.user).remember(data.pop("text"), **data)
        new = memory.confirmations == 0  # a fact found again counts a confirmation
        return Response(
            s.MemorySerializer(memory).data,
            status=status.HTTP_201_CREATED if new else status.HTTP_200_OK,
        )

    def retrieve(self, request: Request, key: str) -> Response:
        versions = Memory.learned(request.user).history(key)
        if not versions:
            return Response(
                {"detail": f"No memory {key!r}.", "code": "not_found"},
                status=status.HTTP_404_NOT_FOUND,
            )
        return Response(s.MemorySerializer(versions, many=True).data)

    def partial_update(self, request: Request, key: str) -> Response:
        data = _validated(s.MemoryWriteSerializer, request.data)
        learned = Memory.learned(request.user)
        if not learned.history(key):
            return Response(
                {"detail": f"No memory {key!r}.", "code": "not_found"},
                status=status.HTTP_404_NOT_FOUND,
            )
        return Response(s.MemorySerializer(learned.update(key, data.pop("text"), **data)).data)

    def destroy(self, request: Request, key: str) -> Response:
        if not Memory.learned(request.user).forget(key):
            return Response(
                {"detail": f"No current memory {key!r}.", "code": "not_found"},
                status=status.HTTP_404_NOT_FOUND,
            )
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema_view(
    list=extend_schema(
        summary="Your memory blocks",
        description="Your blocks, which every window of your sessions carries.",
        responses={200: s.BlockSerializer(many=True), **AUTH_ERRORS},
    ),
    update=extend_schema(
        summary="Write a memory block",
        description="Replaces the block's text (or appends a line with `append`), creating it. "
        "A text past MEMORY_BLOCK_MAX_CHARS, or a new block past MEMORY_BLOCKS_MAX, is 400.",
        parameters=[BLOCK_NAME],
        request=s.BlockWriteSerializer,
        responses={200: s.BlockSerializer, **_errors(BAD_INPUT, NO_ROUTE, UNSUPPORTED)},
    ),
    destroy=extend_schema(
        summary="Delete a memory block",
        parameters=[BLOCK_NAME],
        responses={204: None, **_errors(BAD_INPUT, NOT_FOUND)},
    ),
)
class BlockViewSet(MemoryAPIMixin, ViewSet):
    """The requesting user's memory blocks."""

    lookup_field = "name"
    lookup_value_regex = r"[^/]+"  # any name reaches the view: a bad one is a 400 naming it

    def list(self, request: Request) -> Response:
        found = Memory.learned(request.user).blocks()
        return Response(s.BlockSerializer(found, many=True).data)

    def update(self, request: Request, name: str) -> Response:
        data = _validated(s.BlockWriteSerializer, request.data)
        block = Memory.learned(request.user).write_block(name, data["text"], append=data["append"])
        return Response(s.BlockSerializer(block).data)

    def destroy(self, request: Request, name: str) -> Response:
        if not Memory.learned(request.user).delete_block(name):
            return _no_block(name)
        return Response(status=status.HTTP_204_NO_CONTENT)


# -- per owner: export and erase everything of the requesting user (memory_app.owners) ------------


@extend_schema_view(
    export=extend_schema(
        summary="Export all your memory",
        description="Every session you own (messages, snapshots, metadata) as one JSON document, "
        "streamed. Each element of `sessions` restores with POST `sessions/import/`.",
        responses={200: s.OwnerExportSerializer, **AUTH_ERRORS},
    ),
    erase=extend_schema(
        summary="Erase all your memory",
        description="Deletes every session you own with its messages, snapshots, embeddings "
        'and metadata, in one transaction. Requires `{"confirm": "erase"}`.',
        request=s.OwnerEraseSerializer,
        examples=[OpenApiExample("Confirm", request_only=True, value={"confirm": "erase"})],
        responses={200: s.ErasedRowsSerializer, **_errors(BAD_INPUT, UNSUPPORTED)},
    ),
)
class OwnerViewSet(MemoryAPIMixin, ViewSet):
    """The requesting user's memory as a whole. Always the requester's own, for staff too."""

    @action(detail=False, methods=["get"])
    def export(self, request: Request) -> StreamingHttpResponse:
        response = StreamingHttpResponse(
            Memory.iter_owner_export(request.user), content_type="application/json"
        )
        response["Content-Disposition"] = 'attachment; filename="memory-export.json"'
        return response

    @action(detail=False, methods=["post"])
    def erase(self, request: Request) -> Response:
        _validated(s.OwnerEraseSerializer, request.data)
        return Response(s.ErasedRowsSerializer(Memory.erase_owner(request.user)).data)


__all__ = ["BlockViewSet", "MemoryAPIMixin", "MemoryViewSet", "OwnerViewSet", "SessionViewSet"]
