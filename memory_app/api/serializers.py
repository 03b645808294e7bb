"""Request parsing and response shapes of the REST API.

Messages are validated by the adapter (``memory_app.validation``), not here: the serializers
that describe them exist for the OpenAPI schema, so the rules live in one place. Responses
never include embeddings or internal row ids.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ..conf import memory_settings
from ..models import Role
from ..types import StoredMessage
from ..validation import (
    MAX_COUNT,
    MAX_CURSOR,
    MAX_KEY,
    MAX_MODEL,
    MAX_NAME,
    MAX_NAMESPACE,
    MAX_SEARCH_LIMIT,
    MAX_TITLE,
    MODES,
    PART_TYPES,
    SCOPES,
)
from ..validation import MAX_QUERY_CHARS as MAX_QUERY


class StrictFieldsMixin:
    """Refuse fields the serializer does not accept (unknown or read-only) with a 400 naming them,
    instead of silently ignoring them."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            writable = {name for name, field in self.fields.items() if not field.read_only}
            unknown = sorted(set(data) - writable)
            if unknown:
                allowed = ", ".join(sorted(writable))
                raise serializers.ValidationError(
                    {
                        name: [f"Unknown or read-only field; accepted fields: {allowed}."]
                        for name in unknown
                    }
                )
        return super().to_internal_value(data)


# JSON has types: a client sending 5 for a string or "true" for a boolean is told so, rather
# than having DRF's coercion guess (the schema promises what is accepted, exactly).


class StrictCharField(serializers.CharField):
    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    default_error_messages = {"invalid": "Must be true or false."}

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class StrictIntegerField(serializers.IntegerField):
    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class QueryIntegerField(serializers.IntegerField):
    """An integer in a query string: digits only. (DRF's own also takes ``5.0``, ``5_000`` or
    `` 5``, which the schema does not call integers.)"""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, str) and not re.fullmatch(r"[+-]?[0-9]+", data):
            self.fail("invalid")
        return super().to_internal_value(data)


# -- schema-only building blocks ---------------------------------------------------------------

CONTENT_SCHEMA = {
    "oneOf": [
        {"type": "string"},
        {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {"type": {"type": "string", "enum": sorted(PART_TYPES)}},
                "required": ["type"],
                "additionalProperties": True,
            },
        },
    ],
    "nullable": True,
    "description": "Text, a list of OpenAI content parts, or null (an assistant message with "
    "tool calls).",
}


@extend_schema_field(CONTENT_SCHEMA)
class ContentField(serializers.JSONField):
    """Message content as OpenAI has it: a string, a list of parts, or null."""


class ToolCallFunctionSerializer(serializers.Serializer):
    name = serializers.CharField(min_length=1)
    arguments = serializers.CharField(
        allow_blank=True, help_text="The arguments as a JSON string ('{}' for none)."
    )


class ToolCallSerializer(serializers.Serializer):
    id = serializers.CharField(min_length=1, max_length=MAX_KEY)
    type = serializers.ChoiceField(choices=["function"], default="function")
    function = ToolCallFunctionSerializer()


class MessageInSerializer(serializers.Serializer):
    """An OpenAI chat message, plus the store's optional fields (null means absent)."""

    role = serializers.ChoiceField(choices=Role.choices)
    content = ContentField(required=False, allow_null=True)
    name = serializers.CharField(
        required=False, allow_null=True, allow_blank=True, max_length=MAX_NAME
    )
    tool_calls = ToolCallSerializer(
        many=True, required=False, allow_null=True, help_text="Assistant messages only."
    )
    tool_call_id = serializers.CharField(
        required=False,
        allow_null=True,
        allow_blank=True,
        max_length=MAX_KEY,
        help_text="Tool messages only: the call they answer.",
    )
    metadata = serializers.DictField(
        required=False, allow_null=True, help_text="Free-form, stored with the message."
    )
    remember = serializers.BooleanField(required=False, help_text="Never pruned by snapshots.")
    idempotency_key = serializers.CharField(
        required=False,
        allow_null=True,
        max_length=MAX_KEY,
        help_text="A retried append with the same key returns the stored message instead of a "
        "copy.",
    )
    extra = serializers.DictField(
        required=False, allow_null=True, help_text="Other OpenAI message fields, kept losslessly."
    )


@extend_schema_field(MessageInSerializer(many=True))
class MessageListField(serializers.ListField):
    """A list of messages, passed to the adapter as sent (it validates them)."""


class MessageBatchInSerializer(serializers.Serializer):
    messages = MessageInSerializer(
        many=True, help_text="Appended atomically, in order: all of them or none."
    )


# -- responses ---------------------------------------------------------------------------------


class StoredMessageSerializer(serializers.Serializer):
    """A message of the log in OpenAI form, with its cursor and the store's fields.

    Other OpenAI fields a message was stored with (``extra``, e.g. ``refusal``) appear as
    top-level keys, as in the message that was appended.
    """

    cursor = serializers.IntegerField(
        help_text="Its place in the log: gapless, ordered, never reused."
    )
    role = serializers.ChoiceField(choices=Role.choices)
    content = ContentField(allow_null=True)
    name = serializers.CharField(required=False)
    tool_calls = ToolCallSerializer(many=True, required=False)
    tool_call_id = serializers.CharField(required=False)
    metadata = serializers.DictField()
    tokens = serializers.IntegerField(help_text="Tokens it costs in a chat request.")
    remember = serializers.BooleanField()
    idempotency_key = serializers.CharField(required=False)
    created_at = serializers.DateTimeField()

    def to_representation(self, instance: StoredMessage) -> dict[str, Any]:
        # The adapter's own dict: lossless (extra OpenAI fields pass through) and never embeddings.
        return instance.as_dict()


class AppendedMessagesSerializer(serializers.Serializer):
    """The stored messages: the shape of a page of ``GET messages/``, with no next page."""

    messages = StoredMessageSerializer(
        many=True, help_text="The stored messages, in order, with cursors."
    )
    next = serializers.URLField(allow_null=True, help_text="Always null: an append is one page.")


class MessagePageSerializer(serializers.Serializer):
    """A page of the log; the same shape ``POST messages/`` answers (``next`` is null there)."""

    messages = StoredMessageSerializer(many=True, help_text="Oldest first, with cursors.")
    next = serializers.URLField(
        allow_null=True,
        help_text="The next page in the direction of reading (after the last message, or with "
        "`before`, before the first), or null when there is no more.",
    )


class OpenAIMessageSerializer(serializers.Serializer):
    """An OpenAI chat message, ready to send."""

    role = serializers.ChoiceField(choices=Role.choices)
    content = ContentField(allow_null=True)
    name = serializers.CharField(required=False)
    tool_calls = ToolCallSerializer(many=True, required=False)
    tool_call_id = serializers.CharField(required=False)


class WindowSerializer(serializers.Serializer):
    messages = OpenAIMessageSerializer(
        many=True,
        help_text="What to send the model next: summary and pinned messages, system "
        "messages, then the newest messages that fit.",
    )
    cursors = serializers.ListField(
        child=serializers.IntegerField(allow_null=True),
        help_text="Each message's cursor; null for the summary and pinned messages.",
    )
    tokens = serializers.IntegerField(help_text="Tokens of every message.")
    budget_tokens = serializers.IntegerField(
        help_text="Tokens counted toward max_tokens (not system messages)."
    )
    snapshot_version = serializers.IntegerField(allow_null=True)
    first_cursor = serializers.IntegerField(allow_null=True)
    summary_truncated = serializers.BooleanField(
        help_text="The snapshot's summary was cut to fit max_tokens (it ends with a marker)."
    )
    unanswered_tool_calls = serializers.ListField(
        child=serializers.CharField(),
        help_text="Ids of tool calls left out because their result is not in the window "
        "(OpenAI refuses a call without its result).",
    )

    def to_representation(self, instance) -> dict[str, Any]:
        data = dataclasses.asdict(instance)
        data["unanswered_tool_calls"] = list(instance.unanswered_tool_calls)
        return data


class SnapshotSerializer(serializers.Serializer):
    version = serializers.IntegerField(help_text="1, 2, 3... per session.")
    upto = serializers.IntegerField(help_text="Cursor of the last message the summary stands for.")
    summary = serializers.CharField()
    pinned = OpenAIMessageSerializer(many=True, help_text="Sent with the summary in every window.")
    model = serializers.CharField(allow_blank=True)
    metadata = serializers.DictField()
    created_at = serializers.DateTimeField(allow_null=True)

    def to_representation(self, instance) -> dict[str, Any]:
        return dataclasses.asdict(instance)


class SessionSerializer(serializers.Serializer):
    id = serializers.UUIDField(read_only=True)
    key = serializers.CharField(read_only=True)
    namespace = serializers.CharField(read_only=True)
    title = serializers.CharField(read_only=True)
    metadata = serializers.DictField(read_only=True)
    message_count = serializers.IntegerField(read_only=True, help_text="Messages stored now.")
    token_count = serializers.IntegerField(
        read_only=True, help_text="Tokens of the stored messages."
    )
    has_snapshot = serializers.BooleanField(read_only=True)
    created_at = serializers.DateTimeField(read_only=True)
    updated_at = serializers.DateTimeField(read_only=True)
    expires_at = serializers.DateTimeField(read_only=True, allow_null=True)


# -- requests ----------------------------------------------------------------------------------


class SessionCreateSerializer(StrictFieldsMixin, serializers.Serializer):
    key = StrictCharField(max_length=MAX_KEY, help_text="Unique per owner and namespace.")
    namespace = StrictCharField(
        max_length=MAX_NAMESPACE, required=False, help_text="The agent's name."
    )
    title = StrictCharField(max_length=MAX_TITLE, required=False, allow_blank=True)
    metadata = serializers.DictField(required=False)
    expires_at = serializers.DateTimeField(
        required=False, allow_null=True, help_text="Deleted by memory_prune after this time."
    )
    get_or_create = StrictBooleanField(
        default=False,
        help_text="When the key is taken: false (default) answers 409; true returns the existing "
        "session with 200 (its title, metadata and expiry unchanged).",
    )


class SessionUpdateSerializer(StrictFieldsMixin, serializers.Serializer):
    title = StrictCharField(max_length=MAX_TITLE, required=False, allow_blank=True)
    metadata = serializers.DictField(
        required=False, help_text="Replaces the whole metadata object."
    )
    expires_at = serializers.DateTimeField(
        required=False, allow_null=True, help_text="null: never expires."
    )


class SnapshotCreateSerializer(StrictFieldsMixin, serializers.Serializer):
    summary = StrictCharField(help_text="Stands for every message up to `upto`.")
    upto = StrictIntegerField(
        min_value=0,
        max_value=MAX_CURSOR,
        help_text="Cursor of the last message the summary covers.",
    )
    prev_version = StrictIntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=MAX_COUNT,
        help_text="Version of the latest snapshot you read; omit or null if there was none. "
        "If another snapshot was saved since, the answer is 409 and nothing is written.",
    )
    pinned = MessageListField(
        required=False, help_text="Messages always sent with the summary (e.g. the task)."
    )
    model = StrictCharField(
        required=False, allow_blank=True, max_length=MAX_MODEL, help_text="Who wrote the summary."
    )
    metadata = serializers.DictField(required=False)
    prune = StrictBooleanField(
        required=False,
        allow_null=True,
        help_text="Delete the covered messages (default: the PRUNE_COMPACTED setting).",
    )


class SessionListQuerySerializer(serializers.Serializer):
    namespace = serializers.CharField(
        required=False,
        max_length=MAX_NAMESPACE,
        help_text="Only sessions of this namespace (agent).",
    )


class MessagesQuerySerializer(serializers.Serializer):
    after = QueryIntegerField(
        required=False,
        min_value=0,
        max_value=MAX_CURSOR,
        help_text="Return messages with a cursor greater than this.",
    )
    before = QueryIntegerField(
        required=False,
        min_value=0,
        max_value=MAX_CURSOR,
        help_text="Return messages with a cursor less than this. Without `after`, the page is "
        "the `limit` messages just before it (still oldest first): paging backwards.",
    )
    limit = QueryIntegerField(
        required=False,
        min_value=1,
        help_text="Page size (default API_MESSAGES_PAGE_SIZE, at most API_MESSAGES_MAX_PAGE_SIZE).",
    )

    def get_fields(self) -> dict:
        fields = super().get_fields()
        # The maximum is the setting read now, so the validation and the schema say the same.
        fields["limit"] = QueryIntegerField(
            required=False,
            min_value=1,
            max_value=memory_settings.API_MESSAGES_MAX_PAGE_SIZE,
            help_text=fields["limit"].help_text,
        )
        return fields


class WindowQuerySerializer(serializers.Serializer):
    max_tokens = QueryIntegerField(
        required=False,
        min_value=0,
        max_value=MAX_COUNT,
        help_text="Token budget (system messages do not count).",
    )
    max_messages = QueryIntegerField(
        required=False,
        min_value=0,
        max_value=MAX_COUNT,
        help_text="Most messages after the summary.",
    )
    model = serializers.CharField(
        required=False, max_length=200, help_text="Count tokens with this model's encoding."
    )


class ImportQuerySerializer(serializers.Serializer):
    key = serializers.CharField(
        required=False, max_length=MAX_KEY, help_text="Store under this key instead."
    )
    namespace = serializers.CharField(
        required=False, max_length=MAX_NAMESPACE, help_text="Store in this namespace instead."
    )


# -- export / import ---------------------------------------------------------------------------


class ExportSessionSerializer(serializers.Serializer):
    id = serializers.UUIDField(required=False)
    owner = serializers.JSONField(
        required=False,
        allow_null=True,
        help_text="The owner's primary key (import makes it yours).",
    )
    key = serializers.CharField()
    namespace = serializers.CharField(required=False)
    title = serializers.CharField(required=False, allow_blank=True)
    metadata = serializers.DictField(required=False)
    created_at = serializers.DateTimeField(required=False, allow_null=True)
    updated_at = serializers.DateTimeField(required=False, allow_null=True)
    expires_at = serializers.DateTimeField(required=False, allow_null=True)
    next_seq = serializers.IntegerField(
        required=False, min_value=1, help_text="Cursor the next message gets."
    )


class ExportMessageSerializer(MessageInSerializer):
    cursor = serializers.IntegerField(min_value=1)
    tokens = serializers.IntegerField(required=False, min_value=0)
    idempotency_key = serializers.CharField(required=False, allow_null=True, max_length=MAX_KEY)
    created_at = serializers.DateTimeField(required=False, allow_null=True)


class ExportSnapshotSerializer(serializers.Serializer):
    version = serializers.IntegerField(min_value=1)
    upto = serializers.IntegerField(min_value=1)
    summary = serializers.CharField()
    pinned = OpenAIMessageSerializer(many=True, required=False)
    model = serializers.CharField(required=False, allow_blank=True)
    metadata = serializers.DictField(required=False)
    created_at = serializers.DateTimeField(required=False, allow_null=True)


class SessionExportSerializer(serializers.Serializer):
    """A whole session, lossless: what GET export returns and POST import takes back."""

    format = serializers.ChoiceField(choices=["memory_app.session"])
    version = serializers.ChoiceField(choices=[1])
    session = ExportSessionSerializer()
    messages = ExportMessageSerializer(many=True)
    snapshots = ExportSnapshotSerializer(many=True)

    def to_representation(self, instance: dict[str, Any]) -> dict[str, Any]:
        return instance


# -- per owner: export and erase ---------------------------------------------------------------


class OwnerExportSerializer(serializers.Serializer):
    """Every session of the requesting user; each restores with POST `sessions/import/`."""

    format = serializers.ChoiceField(choices=["memory_app.owner"])
    version = serializers.ChoiceField(choices=[1])
    owner = serializers.DictField(help_text='`{"id": ...}`: whose sessions these are.')
    exported_at = serializers.DateTimeField()
    sessions = SessionExportSerializer(many=True)
    items = serializers.ListField(
        child=serializers.DictField(),
        help_text="The owner's store items (LangGraph's store, remembered facts), every version.",
    )
    checkpoints = serializers.ListField(
        child=serializers.DictField(),
        help_text="LangGraph checkpoints of the owner's threads, with channel values and pending "
        "writes as the framework serialised them (base64).",
    )


class OwnerEraseSerializer(StrictFieldsMixin, serializers.Serializer):
    confirm = serializers.ChoiceField(
        choices=["erase"],
        help_text='Must be "erase": nothing is erased without it.',
    )


class ErasedRowsSerializer(serializers.Serializer):
    sessions = serializers.IntegerField(help_text="Sessions deleted.")
    messages = serializers.IntegerField(help_text="Messages deleted.")
    snapshots = serializers.IntegerField(help_text="Snapshots deleted.")
    embeddings = serializers.IntegerField(help_text="Embeddings deleted.")
    checkpoints = serializers.IntegerField(help_text="LangGraph checkpoints deleted.")
    checkpoint_blobs = serializers.IntegerField(help_text="Their stored channel values deleted.")
    checkpoint_writes = serializers.IntegerField(help_text="Their pending writes deleted.")
    items = serializers.IntegerField(help_text="Store items (LangGraph's store) deleted.")

    def to_representation(self, instance) -> dict[str, Any]:
        return instance.as_dict()


# -- recall and summarization (SessionMemory.search / context / summarize_async) ----------------
# The adapter checks the search arguments (InvalidSearch, a 400 naming the field); these
# serializers only turn query strings into Python values and describe the rules in the schema.


@extend_schema_field({"type": "integer", "minimum": 1, "maximum": MAX_SEARCH_LIMIT, "default": 5})
class SearchLimitField(QueryIntegerField):
    """How many results; the range is the adapter's (``InvalidSearch`` on ``limit``)."""


@extend_schema_field({"type": "integer", "minimum": 0, "default": 5})
class RecallCountField(QueryIntegerField):
    """How many messages to recall; 0 is a plain window (the adapter checks it)."""


@extend_schema_field({"type": "string", "enum": list(SCOPES), "default": "session"})
class ScopeField(serializers.CharField):
    """``session`` or ``owner``, checked by the adapter."""


@extend_schema_field({"type": "string", "enum": list(MODES)})
class ModeField(serializers.CharField):
    """``hybrid``, ``vector`` or ``fulltext``, checked by the adapter."""


@extend_schema_field(
    {"type": "string", "pattern": rf"^({'|'.join(Role.values)})(,({'|'.join(Role.values)}))*$"}
)
class RolesField(serializers.CharField):
    """A comma-separated list of roles, handed to the adapter as a list (it checks the roles)."""

    def to_internal_value(self, data: Any) -> list[str]:
        return [role.strip() for role in super().to_internal_value(data).split(",")]


@extend_schema_field(
    {
        "type": "string",
        "description": "A JSON object: `metadata` (conditions per key: a value, or "
        '`{"$eq"|"$ne"|"$in"|"$gt"|"$gte"|"$lt"|"$lte": ...}`), `created_after`, '
        "`created_before` (ISO 8601), `namespace`, `session`.",
        "example": '{"metadata": {"topic": "billing", "priority": {"$gte": 2}}}',
    }
)
class FiltersField(serializers.CharField):
    """Recall filters as a JSON object in the query string, checked by the rule book."""

    default_error_messages = {"invalid": "Must be a JSON object."}

    def to_internal_value(self, data: Any) -> Any:
        try:
            value = json.loads(super().to_internal_value(data))
        except ValueError:
            self.fail("invalid")
        if not isinstance(value, dict):
            self.fail("invalid")
        return value


class SearchQuerySerializer(serializers.Serializer):
    q = serializers.CharField(max_length=MAX_QUERY, help_text="What to look for.")
    filters = FiltersField(required=False, help_text="Only messages these conditions keep.")
    limit = SearchLimitField(required=False, default=5, help_text="How many results, best first.")
    scope = ScopeField(
        required=False,
        default="session",
        help_text="`session`: this session; `owner`: every session of its owner.",
    )
    mode = ModeField(
        required=False,
        help_text="`hybrid` (vector and full-text fused), `vector` or "
        "`fulltext`; default: the SEARCH_MODE setting.",
    )
    roles = RolesField(
        required=False,
        help_text="Only messages of these roles, comma-separated (e.g. `user,assistant`).",
    )


class ContextQuerySerializer(WindowQuerySerializer):
    q = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=MAX_QUERY,
        help_text="What the next turn is about; empty or absent: no recall.",
    )
    recall_k = RecallCountField(
        required=False,
        default=5,
        help_text="Most older messages to recall into the untrusted block.",
    )
    scope = ScopeField(
        required=False,
        default="session",
        help_text="Where to recall from: `session` or `owner` (all your sessions).",
    )
    mode = ModeField(required=False, help_text="Search mode of the recall (default: SEARCH_MODE).")
    roles = RolesField(
        required=False,
        help_text="Recall only these roles, comma-separated (default: the RECALL_ROLES setting).",
    )
    memories = RecallCountField(
        required=False,
        default=0,
        help_text="Most of the owner's current facts to include in the block (0: none).",
    )
    filters = FiltersField(required=False, help_text="Recall only what these conditions keep.")


class SearchResultSerializer(serializers.Serializer):
    score = serializers.FloatField(help_text="Higher is better; its scale depends on the mode.")
    cursor = serializers.IntegerField(help_text="The message's cursor in its session.")
    session_id = serializers.UUIDField(help_text="The session the message is in.")
    ranks = serializers.DictField(
        child=serializers.IntegerField(),
        help_text="Its 1-based rank in each ranking that found it.",
    )
    message = StoredMessageSerializer(
        help_text="The message in OpenAI form with its cursor (never its embedding)."
    )

    def to_representation(self, instance) -> dict[str, Any]:
        return {
            "score": instance.score,
            "cursor": instance.cursor,
            "session_id": str(instance.session_id),
            "ranks": dict(instance.ranks),
            "message": instance.message.as_dict(),
        }


class SearchResultsSerializer(serializers.Serializer):
    results = SearchResultSerializer(many=True)


class ContextSerializer(WindowSerializer):
    """A window plus recalled messages, which appear only inside ONE system message labelled as
    untrusted reference data (its cursor is null)."""

    recalled = SearchResultSerializer(
        many=True, help_text="The search results in the recall block."
    )
    recall_tokens = serializers.IntegerField(help_text="Tokens of the recall block (in `tokens`).")
    memories = serializers.ListField(
        child=serializers.DictField(),
        help_text="The owner's facts in the block (`memories=k`), as `memories/` lists them.",
    )
    recall_error = serializers.CharField(
        allow_null=True,
        help_text="Why nothing was recalled when the search failed (the embedder was down); "
        "the window is then the plain one.",
    )

    def to_representation(self, instance) -> dict[str, Any]:
        data = {
            name: getattr(instance, name)
            for name in (
                "messages",
                "cursors",
                "tokens",
                "budget_tokens",
                "snapshot_version",
                "first_cursor",
                "summary_truncated",
                "recall_tokens",
                "recall_error",
            )
        }
        data["unanswered_tool_calls"] = list(instance.unanswered_tool_calls)
        data["recalled"] = SearchResultSerializer(instance.recalled, many=True).data
        data["memories"] = MemorySerializer(instance.memories, many=True).data
        return data


class SummarizeSerializer(StrictFieldsMixin, serializers.Serializer):
    keep_recent = StrictIntegerField(
        required=False,
        allow_null=True,
        min_value=0,
        max_value=MAX_COUNT,
        help_text="Newest messages left out of the summary (default: SUMMARIZE_KEEP_RECENT).",
    )


class TaskSerializer(serializers.Serializer):
    task_id = serializers.CharField(
        allow_null=True,
        help_text="The summarize_session task's id (null when one was already pending).",
    )
    state = serializers.ChoiceField(
        choices=["queued", "ran", "pending"],
        help_text="queued: a worker will run it; ran: no broker, it ran before this answer; "
        "pending: a run for this session was already queued or running.",
    )


# -- errors ------------------------------------------------------------------------------------


class ErrorSerializer(serializers.Serializer):
    detail = serializers.CharField(help_text="What went wrong, for people.")
    code = serializers.CharField(help_text="What went wrong, for programs (e.g. invalid_message).")
    field = serializers.CharField(
        required=False, help_text="The field at fault, when there is one."
    )
    index = serializers.IntegerField(required=False, help_text="The message's place in a batch.")
    errors = serializers.DictField(required=False, help_text="Messages by field.")


class SnapshotConflictSerializer(ErrorSerializer):
    expected_version = serializers.IntegerField(
        allow_null=True, help_text="The prev_version you sent."
    )
    current_version = serializers.IntegerField(allow_null=True, help_text="The latest version now.")
    current = SnapshotSerializer(
        allow_null=True, help_text="The latest snapshot now: reload from it."
    )


# -- learned memory and memory blocks --------------------------------------------------------------
class MemorySerializer(serializers.Serializer):
    key = serializers.CharField(help_text="The memory's key, the same in every version.")
    text = serializers.CharField()
    importance = serializers.FloatField(allow_null=True, help_text="From 0 to 1.")
    valid_from = serializers.DateTimeField(help_text="When this version came into force.")
    invalid_at = serializers.DateTimeField(
        allow_null=True, help_text="When it ended (null while in force)."
    )
    ended = serializers.CharField(
        help_text="Why it ended: superseded, retired or evicted (empty while in force)."
    )
    session_id = serializers.UUIDField(allow_null=True, help_text="The session it came from.")
    source_cursors = serializers.ListField(
        child=serializers.IntegerField(), help_text="The messages it came from."
    )
    metadata = serializers.DictField()
    topic = serializers.CharField()
    confirmations = serializers.IntegerField(help_text="Times the same fact was found again.")
    score = serializers.FloatField(allow_null=True, help_text="Search score (searches only).")

    def to_representation(self, instance) -> dict[str, Any]:
        data = instance.as_dict()
        data.pop("id", None)
        data["session_id"] = str(instance.session_id) if instance.session_id else None
        data["source_cursors"] = list(instance.source_cursors)
        for name in ("valid_from", "invalid_at"):
            value = data[name]
            data[name] = value.isoformat() if value else None
        return data


class MemoryQuerySerializer(serializers.Serializer):
    q = serializers.CharField(
        required=False, max_length=MAX_QUERY, help_text="Rank by this (absent: newest first)."
    )
    as_of = serializers.CharField(
        required=False, help_text="What was in force at this ISO 8601 date-time."
    )
    filters = FiltersField(required=False, help_text="Only memories these conditions keep.")
    limit = SearchLimitField(required=False, default=20, help_text="How many.")
    offset = QueryIntegerField(required=False, default=0, min_value=0, max_value=MAX_COUNT)


class MemoryWriteSerializer(StrictFieldsMixin, serializers.Serializer):
    text = StrictCharField(help_text="The fact, as a sentence.")
    metadata = serializers.JSONField(required=False, help_text="A JSON object.")
    topic = StrictCharField(required=False, allow_blank=True, max_length=100)
    importance = serializers.FloatField(
        required=False, allow_null=True, min_value=0, max_value=1, help_text="From 0 to 1."
    )


class BlockSerializer(serializers.Serializer):
    name = serializers.CharField()
    text = serializers.CharField()
    scope = serializers.ChoiceField(choices=["owner", "session"])
    limit = serializers.IntegerField(help_text="Most characters the block holds.")
    updated_at = serializers.DateTimeField(allow_null=True)

    def to_representation(self, instance) -> dict[str, Any]:
        return {
            "name": instance.name,
            "text": instance.text,
            "scope": instance.scope,
            "limit": instance.limit,
            "updated_at": instance.updated_at.isoformat() if instance.updated_at else None,
        }


class BlockWriteSerializer(StrictFieldsMixin, serializers.Serializer):
    text = StrictCharField(allow_blank=True, help_text="The block's text, or the line to add.")
    append = StrictBooleanField(
        required=False, default=False, help_text="Add the text as a new line."
    )
