"""Sessions, their append-only message log, snapshots and embeddings.

Invariants live in the database: one key per owner + namespace (an ownerless key collides with
itself too), one ``seq`` per session (the cursor: gapless, never reused), one snapshot version
per session, one embedding per message and embedding model.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.contrib.postgres.search import SearchVectorExact
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone
from pgvector.django import VectorField


class TsVectorField(models.Field):
    """A PostgreSQL ``tsvector`` column, as Django's ``SearchVectorField`` (which from Django 6.1
    asks hosts to install ``django.contrib.postgres``; the store fills and reads these columns
    with its own SQL, so a host adds only ``memory_app``)."""

    description = "text search vector"

    def db_type(self, connection) -> str:
        return "tsvector"


# ``search_vector=SearchQuery(...)`` matches (``@@``), as on Django's own field.
TsVectorField.register_lookup(SearchVectorExact)


class Role(models.TextChoices):
    SYSTEM = "system", "system"
    USER = "user", "user"
    ASSISTANT = "assistant", "assistant"
    TOOL = "tool", "tool"


class SessionQuerySet(models.QuerySet):
    def for_owner(self, owner) -> SessionQuerySet:
        """Sessions of one owner; ``None`` means the ownerless ones (never everybody's)."""
        if owner is None:
            return self.filter(owner__isnull=True)
        return self.filter(owner=owner)

    def expired(self, now=None) -> SessionQuerySet:
        return self.filter(expires_at__lte=now or timezone.now())

    def idle_since(self, cutoff) -> SessionQuerySet:
        return self.filter(updated_at__lt=cutoff)

    def with_snapshot_flag(self) -> SessionQuerySet:
        return self.annotate(
            has_snapshot=models.Exists(Snapshot.objects.filter(session=models.OuterRef("pk")))
        )


class Session(models.Model):
    id = models.UUIDField("id", primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name="owner",
        help_text="Who the conversation belongs to; empty for ownerless (service) sessions.",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="memory_sessions",
        # The unique (owner, namespace, key) index starts with the owner and serves every
        # lookup by owner: an index of its own would only cost each session write one more.
        db_index=False,
    )
    namespace = models.CharField(
        "namespace", max_length=100, default="default", help_text="The agent's name."
    )
    key = models.CharField(
        "key",
        max_length=255,
        help_text="Caller's name for the session, unique per owner and namespace.",
    )
    title = models.CharField("title", max_length=255, blank=True, default="")
    metadata = models.JSONField("metadata", default=dict, blank=True)
    created_at = models.DateTimeField("created", default=timezone.now, editable=False)
    updated_at = models.DateTimeField("updated", default=timezone.now, db_index=True)
    expires_at = models.DateTimeField(
        "expires", null=True, blank=True, help_text="Deleted by memory_prune after this time."
    )
    next_seq = models.BigIntegerField(
        "next cursor", default=1, help_text="Cursor the next message gets; never goes back."
    )
    message_count = models.BigIntegerField(
        "messages", default=0, help_text="Messages stored now (pruned and cleared ones leave)."
    )
    token_count = models.BigIntegerField(
        "tokens", default=0, help_text="Tokens of the stored messages."
    )
    tokens_since_snapshot = models.BigIntegerField(
        "tokens after snapshot",
        default=0,
        help_text="Tokens of the messages after the latest snapshot; drives auto-summarization.",
    )
    extracted_upto = models.BigIntegerField(
        "memories extracted up to",
        default=0,
        help_text="Cursor of the last message memory extraction has read (compare-and-swap).",
    )

    objects = SessionQuerySet.as_manager()

    class Meta:
        verbose_name = "session"
        verbose_name_plural = "sessions"
        ordering = ["-updated_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "namespace", "key"], name="memory_session_owner_ns_key_uniq"
            ),
            # NULL owners are distinct to a plain unique index; this one makes them collide.
            models.UniqueConstraint(
                fields=["namespace", "key"],
                condition=Q(owner__isnull=True),
                name="memory_session_ownerless_ns_key_uniq",
            ),
            models.CheckConstraint(
                condition=Q(next_seq__gte=1), name="memory_session_next_seq_positive"
            ),
        ]
        indexes = [
            models.Index(
                fields=["owner", "namespace", "-updated_at"], name="memory_session_owner_upd_idx"
            ),
            models.Index(
                fields=["expires_at"],
                name="memory_session_expires_idx",
                condition=Q(expires_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return self.title or self.key

    @property
    def messages_saved(self) -> int:
        """Messages ever appended, pruned and cleared ones included."""
        return self.next_seq - 1


class Message(models.Model):
    session = models.ForeignKey(
        Session,
        verbose_name="session",
        on_delete=models.CASCADE,
        related_name="messages",
        # The (session, seq) unique index serves every lookup by session: a second index on
        # session alone would only cost each append one more index insert.
        db_index=False,
    )
    seq = models.BigIntegerField(
        "cursor", help_text="Position in the session's log, from 1, gapless."
    )
    role = models.CharField("role", max_length=16, choices=Role.choices)
    content = models.TextField(
        "content",
        blank=True,
        default="",
        help_text="The text (of all text parts, for multi-part content).",
    )
    content_parts = models.JSONField(
        "content parts",
        null=True,
        blank=True,
        help_text="OpenAI content parts, when content is a list.",
    )
    name = models.CharField("name", max_length=128, blank=True, default="")
    tool_calls = models.JSONField("tool calls", null=True, blank=True)
    tool_call_id = models.CharField("tool call id", max_length=255, blank=True, default="")
    extra = models.JSONField(
        "extra fields", null=True, blank=True, help_text="Other message fields, kept losslessly."
    )
    metadata = models.JSONField("metadata", default=dict, blank=True)
    token_count = models.IntegerField("tokens", default=0)
    remember = models.BooleanField(
        "remember", default=False, help_text="Embedded at once and never pruned."
    )
    # NULL, not "", for "no key": the unique constraint only covers rows that have one.
    idempotency_key = models.CharField(  # noqa: DJ001
        "idempotency key",
        max_length=255,
        null=True,
        blank=True,
        help_text="Client key: a retried append with it returns this message instead of a copy.",
    )
    created_at = models.DateTimeField("created", db_default=Now(), editable=False)
    # Indexing for recall happens after the append, off the request path: the append only
    # leaves this mark (the column default), and the after-append job (or the sweep, after a
    # crash) fills ``search_vector``, embeds what recall wants and clears it.
    index_pending = models.BooleanField(
        "indexing pending",
        db_default=True,
        editable=False,
        help_text="Set by the append; cleared once the message is indexed for recall "
        "(full text, and a vector where one is wanted).",
    )
    search_vector = TsVectorField(
        "full-text vector",
        null=True,
        blank=True,
        editable=False,
        help_text="to_tsvector of the content, filled after the append (PostgreSQL).",
    )

    class Meta:
        verbose_name = "message"
        verbose_name_plural = "messages"
        ordering = ["session", "seq"]
        constraints = [
            # Also the index behind "last N" (backward scan) and "after cursor C" (forward scan).
            models.UniqueConstraint(
                fields=["session", "seq"], name="memory_message_session_seq_uniq"
            ),
            models.UniqueConstraint(
                fields=["session", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="memory_message_idempotency_uniq",
            ),
            models.CheckConstraint(condition=Q(seq__gte=1), name="memory_message_seq_positive"),
            models.CheckConstraint(
                condition=Q(role__in=[r.value for r in Role]), name="memory_message_role_valid"
            ),
        ]
        indexes = [
            # What the after-append job and the sweep still have to index: a small partial
            # index (rows leave it within moments of their append).
            models.Index(
                fields=["session", "seq"],
                name="memory_message_pending_idx",
                condition=Q(index_pending=True),
            ),
            # System messages are always kept in a window; find them without a scan.
            models.Index(
                fields=["session", "seq"],
                name="memory_message_system_idx",
                condition=Q(role="system"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.session_id}#{self.seq} {self.role}"


class Snapshot(models.Model):
    session = models.ForeignKey(
        Session,
        verbose_name="session",
        on_delete=models.CASCADE,
        related_name="snapshots",
        db_index=False,  # the unique (session, version) index serves lookups by session
    )
    version = models.PositiveIntegerField("version", help_text="1, 2, 3... per session.")
    upto = models.BigIntegerField(
        "covers up to", help_text="Cursor of the last message the summary stands for."
    )
    summary = models.TextField("summary")
    pinned = models.JSONField(
        "pinned messages",
        default=list,
        blank=True,
        help_text="Messages always sent with the summary (e.g. the task), OpenAI format.",
    )
    model = models.CharField(
        "model", max_length=200, blank=True, default="", help_text="Who wrote the summary."
    )
    metadata = models.JSONField("metadata", default=dict, blank=True)
    created_at = models.DateTimeField("created", default=timezone.now, editable=False)

    class Meta:
        verbose_name = "snapshot"
        verbose_name_plural = "snapshots"
        ordering = ["session", "-version"]
        get_latest_by = "version"
        constraints = [
            models.UniqueConstraint(
                fields=["session", "version"], name="memory_snapshot_version_uniq"
            ),
            models.CheckConstraint(condition=Q(upto__gte=1), name="memory_snapshot_upto_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.session_id} v{self.version} (≤{self.upto})"


class Embedding(models.Model):
    """A message's vector under one embedding model; models of different dimensions coexist.

    It is also the message's long-term memory: ``cursor``, ``role`` and ``message_created_at``
    are copied here when it is embedded, and ``content`` when pruning removes the log row
    (``message`` becomes NULL), so recall still finds what a snapshot's summary compressed.
    Clearing, deleting and erasing a session or owner remove it. There is one per session,
    cursor and model, so promoting a message twice stores nothing twice.

    ``owner`` and ``session`` are copied here so owner-scope search filters without a join.
    The HNSW index is per model (``memory_app.search`` creates a partial index on
    ``vector::vector(dims)`` for each model it meets).
    """

    message = models.ForeignKey(
        Message,
        verbose_name="message",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="embeddings",
        help_text="The log row; empty once pruning removed it "
        "(recall then reads the fields below).",
    )
    # The (session, model) and (owner, model) indexes below serve lookups by session and by
    # owner: indexes of their own would only cost each embedding two more index inserts.
    session = models.ForeignKey(
        Session,
        verbose_name="session",
        on_delete=models.CASCADE,
        related_name="embeddings",
        db_index=False,
    )
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name="owner",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="+",
        db_index=False,
    )
    cursor = models.BigIntegerField("cursor", help_text="The message's cursor in its session.")
    role = models.CharField("role", max_length=16, choices=Role.choices)
    content = models.TextField(
        "content",
        blank=True,
        default="",
        help_text="The message's text once its log row is pruned (encrypted as the log's is); "
        "empty while the row exists.",
    )
    message_created_at = models.DateTimeField("message created", null=True, blank=True)
    model = models.CharField("embedding model", max_length=200)
    dimensions = models.PositiveIntegerField("dimensions")
    vector = VectorField("vector")
    created_at = models.DateTimeField("created", default=timezone.now, editable=False)

    class Meta:
        verbose_name = "embedding"
        verbose_name_plural = "embeddings"
        constraints = [
            models.UniqueConstraint(
                fields=["session", "cursor", "model"],
                name="memory_embedding_session_cursor_model_uniq",
            ),
        ]
        indexes = [
            models.Index(fields=["session", "model"], name="memory_embedding_session_idx"),
            models.Index(fields=["owner", "model"], name="memory_embedding_owner_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.session_id}#{self.cursor} [{self.model}]"


# ---- LangGraph state: checkpoints of a thread (a thread is a session) ---------------------------
# Checkpoint rows keep what LangGraph needs to list and filter (ids, parent, metadata, the channel
# versions) as JSON; channel values and pending writes are opaque serialised blobs, stored once
# per (channel, version) so a step that changes one channel does not copy the others.
# They hang off the session, so its owner scoping, retention, erase and export cover them.


class Checkpoint(models.Model):
    session = models.ForeignKey(
        Session,
        verbose_name="session",
        on_delete=models.CASCADE,
        related_name="checkpoints",
        db_index=False,  # the unique index below starts with the session
    )
    checkpoint_ns = models.CharField(
        "checkpoint namespace",
        max_length=255,
        blank=True,
        default="",
        help_text="Empty for the root graph; 'node:task' for a subgraph.",
    )
    checkpoint_id = models.CharField(
        "checkpoint id", max_length=64, help_text="Time-ordered (uuid6): newest sorts last."
    )
    parent_checkpoint_id = models.CharField(
        "parent checkpoint id", max_length=64, blank=True, default=""
    )
    run_id = models.CharField(
        "run id",
        max_length=255,
        blank=True,
        default="",
        help_text="The run that wrote it (from its metadata), for deleting a run's checkpoints.",
    )
    checkpoint = models.JSONField(
        "checkpoint", help_text="The checkpoint without its channel values (ids, versions)."
    )
    metadata = models.JSONField("metadata", default=dict, blank=True)
    created_at = models.DateTimeField("created", default=timezone.now, editable=False)

    class Meta:
        verbose_name = "checkpoint"
        verbose_name_plural = "checkpoints"
        ordering = ["session", "checkpoint_ns", "-checkpoint_id"]
        constraints = [
            # Also the index behind "latest of a thread" and "list newest first".
            models.UniqueConstraint(
                fields=["session", "checkpoint_ns", "checkpoint_id"],
                name="memory_checkpoint_id_uniq",
            ),
        ]
        indexes = [
            models.Index(
                fields=["run_id"], name="memory_checkpoint_run_idx", condition=~Q(run_id="")
            ),
        ]

    def __str__(self) -> str:
        return f"{self.session_id} {self.checkpoint_ns or '(root)'} {self.checkpoint_id}"


class CheckpointBlob(models.Model):
    session = models.ForeignKey(
        Session,
        verbose_name="session",
        on_delete=models.CASCADE,
        related_name="checkpoint_blobs",
        db_index=False,
    )
    checkpoint_ns = models.CharField("checkpoint namespace", max_length=255, blank=True, default="")
    channel = models.CharField("channel", max_length=255)
    version = models.CharField("version", max_length=64)
    type = models.CharField(
        "type", max_length=32, help_text="The serialiser's type tag ('empty': no value)."
    )
    blob = models.BinaryField(
        "value", null=True, blank=True, help_text="Encrypted when keys are set."
    )

    class Meta:
        verbose_name = "checkpoint channel value"
        verbose_name_plural = "checkpoint channel values"
        constraints = [
            models.UniqueConstraint(
                fields=["session", "checkpoint_ns", "channel", "version"],
                name="memory_checkpoint_blob_uniq",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.session_id} {self.channel}@{self.version}"


class CheckpointWrite(models.Model):
    session = models.ForeignKey(
        Session,
        verbose_name="session",
        on_delete=models.CASCADE,
        related_name="checkpoint_writes",
        db_index=False,
    )
    checkpoint_ns = models.CharField("checkpoint namespace", max_length=255, blank=True, default="")
    checkpoint_id = models.CharField("checkpoint id", max_length=64)
    task_id = models.CharField("task id", max_length=255)
    task_path = models.CharField("task path", max_length=1024, blank=True, default="")
    idx = models.IntegerField("index", help_text="Position in the task's writes (<0: special).")
    channel = models.CharField("channel", max_length=255)
    type = models.CharField("type", max_length=32)
    blob = models.BinaryField(
        "value", null=True, blank=True, help_text="Encrypted when keys are set."
    )

    class Meta:
        verbose_name = "pending write"
        verbose_name_plural = "pending writes"
        constraints = [
            # A task's write stored twice (a retried step) is one row.
            models.UniqueConstraint(
                fields=["session", "checkpoint_ns", "checkpoint_id", "task_id", "idx"],
                name="memory_checkpoint_write_uniq",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.checkpoint_id} {self.task_id}[{self.idx}] {self.channel}"


# ---- an owner's items: LangGraph's long-term store, and learned memories to come ----------------
class ItemQuerySet(models.QuerySet):
    def for_owner(self, owner_id) -> ItemQuerySet:
        """Items of one owner; ``None`` means the ownerless ones (never everybody's)."""
        if owner_id is None:
            return self.filter(owner__isnull=True)
        return self.filter(owner_id=owner_id)

    def current(self, now=None) -> ItemQuerySet:
        """The versions in force: not superseded, not expired."""
        now = now or timezone.now()
        return self.filter(invalid_at__isnull=True).filter(
            Q(expires_at__isnull=True) | Q(expires_at__gt=now)
        )


class Item(models.Model):
    """A value an owner keeps under a namespace and key (LangGraph's ``BaseStore`` item).

    Built to hold what an agent learns about an owner too: a version is superseded, not
    overwritten, when ``invalid_at`` is set (the history stays readable), and ``session`` and
    ``source_cursors`` say where it came from. Only one version of a key is in force at a time
    (a partial unique constraint). ``vector`` and ``search_vector`` serve search by meaning and
    by words (a GIN index on PostgreSQL, created by migration 0006).
    """

    id = models.UUIDField("id", primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        verbose_name="owner",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="memory_items",
        help_text="Whose item it is; empty for ownerless (service) items.",
        db_index=False,  # the (owner, namespace, key) index serves lookups by owner
    )
    namespace = models.CharField(
        "namespace",
        max_length=1024,
        help_text="The namespace's labels joined by '.' (labels never contain one).",
    )
    key = models.CharField("key", max_length=255)
    value = models.JSONField("value", help_text="A JSON object.")
    kind = models.CharField(
        "kind", max_length=32, default="item", help_text="'item': put through the store."
    )
    session = models.ForeignKey(
        Session,
        verbose_name="source session",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The session it was learned in, if any.",
    )
    source_cursors = models.JSONField(
        "source cursors",
        default=list,
        blank=True,
        help_text="Cursors of the messages it came from.",
    )
    importance = models.FloatField("importance", null=True, blank=True)
    valid_from = models.DateTimeField("valid from", default=timezone.now)
    invalid_at = models.DateTimeField(
        "invalid from", null=True, blank=True, help_text="Set when a newer version supersedes it."
    )
    created_at = models.DateTimeField("created", default=timezone.now, editable=False)
    updated_at = models.DateTimeField("updated", default=timezone.now)
    expires_at = models.DateTimeField(
        "expires", null=True, blank=True, help_text="Not read after this time; swept later."
    )
    ttl_minutes = models.FloatField(
        "TTL (minutes)",
        null=True,
        blank=True,
        help_text="A read moves the expiry this far ahead (refresh on read).",
    )
    embedding_model = models.CharField("embedding model", max_length=200, blank=True, default="")
    vector = VectorField("vector", null=True, blank=True)
    search_vector = TsVectorField("full-text vector", null=True, blank=True, editable=False)

    #: Kinds: put through LangGraph's store, a learned fact, a memory block.
    ITEM, MEMORY, BLOCK = "item", "memory", "block"

    objects = ItemQuerySet.as_manager()

    class Meta:
        verbose_name = "store item"
        verbose_name_plural = "store items"
        ordering = ["namespace", "key"]
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "namespace", "key"],
                condition=Q(invalid_at__isnull=True),
                name="memory_item_current_uniq",
            ),
            models.UniqueConstraint(
                fields=["namespace", "key"],
                condition=Q(invalid_at__isnull=True, owner__isnull=True),
                name="memory_item_ownerless_current_uniq",
            ),
        ]
        indexes = [
            models.Index(fields=["owner", "namespace", "key"], name="memory_item_owner_ns_idx"),
            models.Index(
                fields=["expires_at"],
                name="memory_item_expires_idx",
                condition=Q(expires_at__isnull=False),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.key}"


class LearnedMemory(Item):
    """An owner's learned memories (items of kind ``memory``), as the admin lists them."""

    class Meta:
        proxy = True
        verbose_name = "memory"
        verbose_name_plural = "memories"

    def __str__(self) -> str:
        text = str((self.value or {}).get("text", ""))
        return text if len(text) <= 80 else text[:79] + "…"
