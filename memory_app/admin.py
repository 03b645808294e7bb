"""The admin: browse sessions, read their transcripts, and act on them.

Everything that reads or changes a session goes through the adapter (``SessionMemory``); the
admin only arranges what it returns (``memory_app.transcript``). The transcript is paged by
cursor (``?after=``/``?before=``/``?at=``) on the ``(session, seq)`` index, so a page costs the
same few queries on a session of ten messages as on one of a million. Messages and snapshots
are never edited here: the log is append-only.

Templates live in ``memory_app/templates/admin/memory_app/session/``; a host project overrides
any of them by putting a file with the same path in one of its template ``DIRS``.
"""

from __future__ import annotations

import functools
import json
import logging
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import model_ngettext, quote, unquote
from django.contrib.postgres.search import SearchQuery
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.core.serializers.json import DjangoJSONEncoder
from django.db import OperationalError, connections, router, transaction
from django.db.models import Count, OuterRef, Q, QuerySet, Subquery
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.text import slugify, smart_split, unescape_string_literal

from . import validation
from .exceptions import InvalidCursor, InvalidSession, MemoryStoreError
from .memory import SessionMemory
from .models import (
    Checkpoint,
    CheckpointBlob,
    CheckpointWrite,
    Item,
    LearnedMemory,
    Message,
    Session,
    Snapshot,
)
from .services import memories, retention
from .store.pending import FULLTEXT_CONFIG
from .transcript import Page, arrange, coverage
from .types import Scheduled, SnapshotView

logger = logging.getLogger(__name__)


class HasSnapshotFilter(admin.SimpleListFilter):
    title = "snapshot"
    parameter_name = "has_snapshot"

    def lookups(self, request, model_admin):
        return (("yes", "Yes"), ("no", "No"))

    def queryset(self, request, queryset):
        # ``has_snapshot`` is the EXISTS annotation SessionAdmin.get_queryset adds.
        if self.value() == "yes":
            return queryset.filter(has_snapshot=True)
        if self.value() == "no":
            return queryset.filter(has_snapshot=False)
        return queryset


class OwnerFilter(admin.RelatedOnlyFieldListFilter):
    """The owners of the newest sessions, at most ``shown`` of them: with thousands of owners
    the full list would be a scan of the sessions and a sidebar of thousands of links. Any
    owner is still a filter (``?owner__id__exact=``), and the one chosen is always listed."""

    shown = 20

    def field_choices(self, field, request, model_admin):
        recent = (
            Session.objects.using(router.db_for_read(Session))
            .filter(owner__isnull=False)
            .order_by("-updated_at")
            .values_list("owner_id", flat=True)[: self.shown * 20]
        )
        ids = list(dict.fromkeys(recent))[: self.shown]
        for value in self.lookup_val or ():
            try:
                ids.append(field.target_field.to_python(value))
            except ValidationError:
                pass  # not an owner's key: the list itself says nothing matches
        ordering = self.field_admin_ordering(field, request, model_admin)
        return field.get_choices(
            include_blank=False, limit_choices_to={"pk__in": ids}, ordering=ordering
        )


class ExpiredFilter(admin.SimpleListFilter):
    title = "expiry"
    parameter_name = "expired"

    def lookups(self, request, model_admin):
        return (("yes", "Expired"), ("no", "Not expired"), ("never", "Never expires"))

    def queryset(self, request, queryset):
        now = timezone.now()
        if self.value() == "yes":
            return queryset.expired(now)
        if self.value() == "no":
            return queryset.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
        if self.value() == "never":
            return queryset.filter(expires_at__isnull=True)
        return queryset


def _download(data: Any, filename: str) -> HttpResponse:
    body = json.dumps(data, cls=DjangoJSONEncoder, ensure_ascii=False, indent=2)
    response = HttpResponse(body, content_type="application/json; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def search_terms(search_term: str) -> list[str]:
    """The words of a search box entry (quoted phrases kept whole), each once, case aside."""
    terms: dict[str, str] = {}
    for bit in smart_split(search_term):
        if bit.startswith(('"', "'")) and bit[0] == bit[-1] and len(bit) > 1:
            bit = unescape_string_literal(bit)
        if bit.strip():
            terms.setdefault(bit.casefold(), bit)
    return list(terms.values())


class BoundedCountPaginator(Paginator):
    """Counts at most ``count_cap`` rows: a list of millions (or a search over them) costs a
    bounded ``COUNT`` over a ``LIMIT``, not a scan of the table. Past the cap the list says
    "10,000+" (``count_label``) and pages up to the cap; filters and search narrow it."""

    count_cap = 10_000

    @cached_property
    def count(self) -> int:
        counted = self.object_list.order_by()[: self.count_cap + 1].count()
        self.capped = counted > self.count_cap
        return min(counted, self.count_cap)

    @property
    def count_label(self) -> str:
        return f"{self.count:,}+" if self.capped else f"{self.count:,}"


def matches_text(term: str, using: str) -> Q:
    """Messages whose text holds ``term``: on PostgreSQL a full-text match on the indexed
    ``search_vector`` (words, stemmed: a GIN lookup, whatever the table's size), elsewhere a
    substring match."""
    if connections[using].vendor != "postgresql":
        return Q(content__icontains=term)
    kind = "phrase" if len(term.split()) > 1 else "plain"
    query = SearchQuery(term, config=FULLTEXT_CONFIG, search_type=kind)
    # A message appended moments ago may not have its vector yet (the after-append job fills
    # it): those few, on their small partial index, are matched by substring.
    return Q(search_vector=query) | Q(index_pending=True, content__icontains=term)


@contextmanager
def statement_timeout(using: str, milliseconds: int):
    """A transaction on ``using`` whose statements PostgreSQL stops after ``milliseconds``
    (``SET LOCAL``: the cap ends with the transaction, pooler-safe); plain elsewhere."""
    with transaction.atomic(using=using):
        connection = connections[using]
        if connection.vendor == "postgresql" and milliseconds:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT set_config('statement_timeout', %s, true)", [f"{milliseconds}ms"]
                )
        yield


def is_query_canceled(error: OperationalError) -> bool:
    """Whether ``error`` is PostgreSQL stopping a statement (``statement_timeout``)."""
    return getattr(error.__cause__, "sqlstate", None) == "57014"


def _export_name(session: Session) -> str:
    key = slugify(session.key)[:60] or session.pk
    return f"session-{slugify(session.namespace) or 'ns'}-{key}.json"


class _AsTyped(str):
    """Text from the form shown back as it was typed (not parsed and written out again)."""


class MetadataField(forms.JSONField):
    """Session metadata as typed in the admin: a JSON object (an empty box is ``{}``).

    Whatever is typed comes back to the page as typed when the rule book refuses it (lone
    surrogates, nesting past ``MAX_JSON_DEPTH``, past Python's own recursion limit): such data
    cannot be written out as UTF-8 or re-encoded, and would otherwise make the page a 500.
    """

    def to_python(self, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            return {}
        try:
            converted = super().to_python(value)
        except RecursionError:
            raise forms.ValidationError("is nested too deeply to read", code="invalid") from None
        if converted is None:
            raise forms.ValidationError("must be a JSON object ({} for none), not null")
        return converted

    def bound_data(self, data: Any, initial: Any) -> Any:
        try:
            value = super().bound_data(data, initial)
        except RecursionError:
            return _AsTyped(data)
        if isinstance(data, str) and validation.unstorable(value):
            return _AsTyped(data)
        return value

    def prepare_value(self, value: Any) -> Any:
        return value if isinstance(value, _AsTyped) else super().prepare_value(value)

    def has_changed(self, initial: Any, data: Any) -> bool:
        try:
            return super().has_changed(initial, data)
        except (forms.ValidationError, RecursionError):
            return True


class SessionForm(forms.ModelForm):
    """The fields a person may edit, checked by the rule book (``validation``) that every other
    entry point goes through: a refusal is an error on its field, never a 500."""

    #: The form fields the rule book checks, by the name ``check_session_fields`` takes.
    checked = ("title", "metadata", "expires_at")

    metadata = MetadataField(required=False, widget=forms.Textarea(attrs={"rows": 6}))

    class Meta:
        model = Session
        fields = ("title", "metadata", "expires_at")

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        given = {name: cleaned[name] for name in self.checked if name in cleaned}
        try:
            validation.check_session_fields(**given)
        except InvalidSession as err:
            field = err.field if err.field in self.fields else None
            self.add_error(field, err.reason if field else str(err))
        return cleaned


def _reported(fallback: Callable[[Any, HttpRequest, tuple, dict], str]):
    """A view of ``SessionAdmin`` whose ``MemoryStoreError`` becomes a message on a page.

    After a POST (an action, a save, a button) the browser is sent back to the page it came
    from, which shows the message; after a GET to ``fallback(admin, request, args, kwargs)``,
    a page that does not read what failed (so that no redirect loops).
    """

    def decorate(view: Callable) -> Callable:
        @functools.wraps(view)
        def wrapper(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            try:
                return view(self, request, *args, **kwargs)
            except MemoryStoreError as err:
                if not err.client_fault:
                    logger.error("admin: %s", err, exc_info=err)
                self.message_user(request, f"{_what_failed(view.__name__)}: {err}", messages.ERROR)
                if request.method == "POST":
                    return HttpResponseRedirect(request.get_full_path())
                return HttpResponseRedirect(fallback(self, request, args, kwargs))

        return wrapper

    return decorate


_VIEW_WORDS = {
    "changelist_view": "The action failed",
    "changeform_view": "The session could not be saved",
    "delete_view": "The session could not be deleted",
    "history_view": "The history failed",
    "export_view": "The export failed",
    "clear_view": "The session could not be cleared",
    "summarize_view": "Summarization failed",
    "reembed_view": "Re-embedding failed",
}


def _what_failed(view_name: str) -> str:
    return _VIEW_WORDS.get(view_name, "That failed")


def _to_changelist(model_admin: SessionAdmin, request, args, kwargs) -> str:
    return reverse("admin:memory_app_session_changelist", current_app=model_admin.admin_site.name)


def _to_index(model_admin: SessionAdmin, request, args, kwargs) -> str:
    return reverse("admin:index", current_app=model_admin.admin_site.name)


def _to_session(model_admin: SessionAdmin, request, args, kwargs) -> str:
    object_id = kwargs.get("object_id", args[0] if args else None)
    if object_id is None:
        return _to_changelist(model_admin, request, args, kwargs)
    return reverse(
        "admin:memory_app_session_change", args=[object_id], current_app=model_admin.admin_site.name
    )


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    """Sessions: the changelist, the transcript on the change page, and the session actions."""

    #: Messages per transcript page.
    transcript_page_size = 50
    #: Snapshot versions whose summaries the session page shows (all are on the coverage bar).
    lineage_size = 10

    list_display = (
        "display_key",
        "display_title",
        "display_owner",
        "display_namespace",
        "messages",
        "tokens",
        "snapshot",
        "display_updated",
    )
    list_display_links = ("display_key",)
    list_filter = (
        ("namespace", admin.AllValuesFieldListFilter),
        ("owner", OwnerFilter),
        HasSnapshotFilter,
        ExpiredFilter,
        ("updated_at", admin.DateFieldListFilter),
    )
    # The fields are listed so that the search box shows; get_search_results does the work.
    search_fields = ("key", "title")
    search_help_text = (
        "Searches keys, titles and the words of every message (a word in very many messages: "
        "the sessions of the first matches)."
    )
    #: Most distinct words a search matches (each is a scan of the messages); the rest are left
    #: out, and the page says so.
    search_max_terms = 8
    #: Most matching messages read per word: past it a word's sessions are those of this
    #: many matches (the page says so), whatever the table's size.
    search_text_sample = 5000
    #: Longest a query of the session list may run, in milliseconds (PostgreSQL): a search
    #: nobody waits for any more must not keep the database busy.
    statement_timeout_ms = 5000
    # No date_hierarchy: it aggregates the whole (searched) list on every page; the updated
    # filter below costs no query.
    ordering = ("-updated_at",)
    list_select_related = ("owner",)
    list_per_page = 50
    paginator = BoundedCountPaginator
    show_full_result_count = False
    empty_value_display = "none"
    actions = ("summarize_now", "export_json", "reembed", "clear_sessions", "delete_selected")

    fieldsets = (
        (None, {"fields": ("title", "expires_at", "retention_policy")}),
        (
            "Identity",
            {"fields": (("key", "namespace"), ("owner", "id"), ("created_at", "updated_at"))},
        ),
        (
            "Counters",
            {
                "fields": (("message_count", "token_count"), ("tokens_since_snapshot", "next_seq")),
                "description": "Kept by the store as messages are appended, pruned and cleared.",
            },
        ),
        ("Metadata", {"fields": ("metadata",), "classes": ("collapse",)}),
    )
    readonly_fields = (
        "id",
        "key",
        "namespace",
        "owner",
        "created_at",
        "updated_at",
        "message_count",
        "token_count",
        "tokens_since_snapshot",
        "next_seq",
        "retention_policy",
    )
    form = SessionForm
    change_form_template = "admin/memory_app/session/change_form.html"

    class Media:
        css = {"all": ("memory_app/admin.css",)}
        js = ("memory_app/admin.js",)

    # -- the views: a store error is a message on the page, never a 500 ----------------------
    @_reported(_to_index)
    def changelist_view(self, request, extra_context=None):
        # The actions run in here (a POST to the changelist): a selection that names no session
        # (a forged or stale form) is a message on the page, not a database error.
        if request.method == "POST":
            selected = request.POST.getlist(admin.helpers.ACTION_CHECKBOX_NAME)
            bad = [value for value in selected if not _is_uuid(value)]
            if bad:
                self.message_user(
                    request, f"No session has the id {bad[0]!r}: nothing was done.", messages.ERROR
                )
                return HttpResponseRedirect(request.get_full_path())
        context = {"title": "Sessions", **(extra_context or {})}
        if request.method != "GET":  # actions may take long (a delete): only reads are capped
            return super().changelist_view(request, context)
        try:
            with statement_timeout(router.db_for_read(Session), self.statement_timeout_ms):
                response = super().changelist_view(request, context)
                if hasattr(response, "render"):
                    response.render()  # the rows are read while rendering: inside the cap
                return response
        except OperationalError as err:
            if not is_query_canceled(err):
                raise
            seconds = self.statement_timeout_ms / 1000
            self.message_user(
                request,
                f"The list took longer than {seconds:g} s and was stopped: search for fewer or "
                "more distinctive words, or narrow it with the filters.",
                messages.ERROR,
            )
            # Back to the plain list, unless that is what ran too long (then to the index).
            fallback = _to_changelist if request.GET else _to_index
            return HttpResponseRedirect(fallback(self, request, (), {}))

    @_reported(_to_changelist)
    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        return super().changeform_view(request, object_id, form_url, extra_context)

    @_reported(_to_session)
    def delete_view(self, request, object_id, extra_context=None):
        return super().delete_view(request, object_id, extra_context)

    @_reported(_to_session)
    def history_view(self, request, object_id, extra_context=None):
        return super().history_view(request, object_id, extra_context)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # Both are subqueries on the (session, version) index: no extra query per row.
        latest_version = Snapshot.objects.filter(session=OuterRef("pk")).order_by("-version")
        return (
            super()
            .get_queryset(request)
            .with_snapshot_flag()
            .annotate(snapshot_version=Subquery(latest_version.values("version")[:1]))
        )

    def get_search_results(self, request, queryset, search_term):
        """Every term must match the key, the title, or the text of one of the messages.

        Message text is looked up once per term (``sessions_mentioning``), never as a
        subquery per session: the cost is bounded by ``search_text_sample``, not by the size
        of the messages table. Terms are matched once each (case aside), at most
        ``search_max_terms`` of them.
        """
        terms = search_terms(search_term)
        if len(terms) > self.search_max_terms:
            self.message_user(
                request,
                f"Only the first {self.search_max_terms} of the {len(terms)} words were searched "
                f"for: {', '.join(terms[: self.search_max_terms])}.",
                messages.WARNING,
            )
            terms = terms[: self.search_max_terms]
        using = router.db_for_read(Message)
        sampled = []
        for term in terms:
            mentioning, complete = self.sessions_mentioning(term, using)
            if not complete:
                sampled.append(term)
            queryset = queryset.filter(
                Q(key__icontains=term) | Q(title__icontains=term) | Q(pk__in=mentioning)
            )
        if sampled and request.method == "GET":
            self.message_user(
                request,
                f"{', '.join(repr(t) for t in sampled)}: in more than "
                f"{self.search_text_sample:,} messages; the list shows the sessions of the "
                f"first {self.search_text_sample:,} found (keys and titles in full). Add words "
                "to narrow it.",
                messages.INFO,
            )
        return queryset, False

    def sessions_mentioning(self, term: str, using: str) -> tuple[set, bool]:
        """Ids of the sessions with a message holding ``term``, and whether that is all of
        them: read from at most ``search_text_sample`` matching messages (``matches_text``:
        the GIN index on PostgreSQL), so a word in millions of messages costs no more than a
        rare one."""
        found = list(
            Message.objects.using(using)
            .filter(matches_text(term, using))
            .order_by()  # index order: no join to sessions for the model's ordering, no sort
            .values_list("session_id", flat=True)[: self.search_text_sample + 1]
        )
        return set(found[: self.search_text_sample]), len(found) <= self.search_text_sample

    @admin.display(description="retention policy")
    def retention_policy(self, obj: Session) -> str:
        policy = retention.policy_for(obj.namespace)
        if not policy:
            return "none (MEMORY_APP['RETENTION'] has no entry for this namespace)"
        return ", ".join(f"{key}: {value}" for key, value in policy.items())

    # Keys, titles and namespaces are the agents' data, of any length and without spaces: the
    # list shows each cut to a width (in full on hover) so every column stays on screen.
    @admin.display(description="key", ordering="key")
    def display_key(self, obj: Session) -> str:
        return format_html('<span class="mem-key mem-cut" title="{}">{}</span>', obj.key, obj.key)

    @admin.display(description="title", ordering="title")
    def display_title(self, obj: Session) -> str:
        if not obj.title:
            return "—"
        return format_html('<span class="mem-title" title="{}">{}</span>', obj.title, obj.title)

    @admin.display(description="messages", ordering="message_count")
    def messages(self, obj: Session) -> str:
        return format_html('<span class="mem-num">{}</span>', f"{obj.message_count:,}")

    @admin.display(description="tokens", ordering="token_count")
    def tokens(self, obj: Session) -> str:
        return format_html('<span class="mem-num">{}</span>', f"{obj.token_count:,}")

    @admin.display(description="snapshot", ordering="snapshot_version")
    def snapshot(self, obj: Session) -> str:
        if not obj.has_snapshot:
            return format_html('<span class="mem-quiet" title="no snapshot">{}</span>', "—")
        return format_html(
            '<span class="mem-pill mem-pill-snap" title="latest snapshot">v{}</span>',
            obj.snapshot_version,
        )

    @admin.display(description="owner", ordering="owner__username")
    def display_owner(self, obj: Session) -> str:
        return (
            str(obj.owner)
            if obj.owner_id
            else format_html('<span class="mem-quiet">{}</span>', "none")
        )

    @admin.display(description="namespace", ordering="namespace")
    def display_namespace(self, obj: Session) -> str:
        return format_html(
            '<span class="mem-pill mem-pill-ns mem-cut" title="{}">{}</span>',
            obj.namespace,
            obj.namespace,
        )

    @admin.display(description="updated", ordering="updated_at")
    def display_updated(self, obj: Session) -> str:
        # One width whatever the date and time ("Sept. 30, 2026, 12:06 p.m." is half as wide
        # again as "May 4, 2026, 9 a.m."), so the columns fit at every hour; the full
        # timestamp is the tooltip.
        local = timezone.localtime(obj.updated_at)
        return format_html(
            '<time class="mem-num" datetime="{}" title="{}">{}</time>',
            local.isoformat(),
            local.strftime("%A %d %B %Y, %H:%M:%S %Z"),
            local.strftime("%Y-%m-%d %H:%M"),
        )

    # -- permissions: sessions are created by agents; the log is append-only ----------------
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    # -- saving and deleting through the adapter ----------------------------------------------
    def save_model(self, request, obj: Session, form, change: bool) -> None:
        # Only the fields a person may edit, through the adapter: a full save() would write
        # back counters read before concurrent appends.
        editable = {"title", "metadata", "expires_at"} & set(form.changed_data)
        if editable:
            SessionMemory(obj).update(**{name: form.cleaned_data[name] for name in editable})

    def delete_model(self, request, obj: Session) -> None:
        SessionMemory(obj).delete()

    def delete_queryset(self, request, queryset: QuerySet) -> None:
        for session in queryset:
            SessionMemory(session).delete()

    def get_deleted_objects(self, objs, request):
        """Summarise what goes with the sessions from the stored counters.

        Django's default walks every related row (a line per message on the confirmation
        page), which on a long session means loading the whole log to ask a question.
        """
        sessions = list(objs)
        ids = [s.pk for s in sessions]
        snapshots = Snapshot.objects.filter(session__in=ids).count()
        deletable = [
            format_html(
                '{}: <a href="{}">{}</a> — {} messages, {} tokens',
                Session._meta.verbose_name.capitalize(),
                reverse(
                    "admin:memory_app_session_change",
                    args=[quote(s.pk)],
                    current_app=self.admin_site.name,
                ),
                s,
                f"{s.message_count:,}",
                f"{s.token_count:,}",
            )
            for s in sessions
        ]
        model_count = {
            Session._meta.verbose_name_plural: len(sessions),
            Message._meta.verbose_name_plural: sum(s.message_count for s in sessions),
            Snapshot._meta.verbose_name_plural: snapshots,
        }
        perms_needed = (
            set() if self.has_delete_permission(request) else {Session._meta.verbose_name}
        )
        return deletable, model_count, perms_needed, []

    # -- the change page: header, snapshot lineage and a page of the transcript --------------
    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if obj is not None:
            try:
                context.update(self.transcript_context(request, obj))
            except MemoryStoreError as err:
                # E.g. messages encrypted with a key no longer configured: the page still shows
                # the session and its fields, and says why the transcript is missing.
                logger.error("admin: transcript of %s: %s", obj.pk, err, exc_info=err)
                self.message_user(request, f"The transcript cannot be shown: {err}", messages.ERROR)
                context.update(_unreadable_transcript(request, str(err)))
        return super().render_change_form(request, context, add, change, form_url, obj)

    def transcript_context(self, request: HttpRequest, session: Session) -> dict[str, Any]:
        """A page of the transcript picked by ``?after=``, ``?before=`` or ``?at=`` (a cursor)."""
        memory = SessionMemory(session)
        size = self.transcript_page_size
        cursor_error = None
        try:
            after, before = _page_request(request)
            page, previous_cursor, next_cursor = _select_page(memory, size, after, before)
        except InvalidCursor as err:
            # A cursor out of range (typed into the URL or "Go to #"): say so, show the newest.
            cursor_error, after, before = str(err), None, None
            page, previous_cursor, next_cursor = _select_page(memory, size, None, None)

        if not page:
            # Past either end of the log: the page offers the way back to the newest instead.
            previous_cursor = next_cursor = None

        # Where every snapshot's range ends (small rows, however many versions there are),
        # and the summaries of the latest few only.
        bounds = memory.snapshot_ranges()
        markers = [SnapshotView(version=version, upto=upto, summary="") for version, upto in bounds]
        transcript = arrange(page, markers, previous=previous_cursor, next=next_cursor)
        lineage = coverage(memory.snapshots(newest=self.lineage_size) if bounds else [], bounds)
        for r in lineage:
            r.link = _link(request, before=r.snapshot.upto + 1)
        stored = memory.cursor_range()
        return {
            "transcript": transcript,
            "lineage": list(reversed(lineage)),
            "lineage_total": len(bounds),
            "lineage_hidden": len(bounds) - len(lineage),
            "latest_snapshot": markers[-1] if markers else None,
            "stored_range": stored,
            "coverage_bar": _coverage_bar(
                coverage(markers), transcript, session.messages_saved, stored
            ),
            "pager": _pager_links(request, transcript),
            "cursor_error": cursor_error,
            "requested_after": after,
            "page_size": size,
            "preserved_query": _preserved(request),
            "checkpoints": _checkpoints_link(session),
        }

    # -- per-session views (the buttons on the change page) ----------------------------------
    def get_urls(self):
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"

        def view(func: Callable) -> Callable:
            return self.admin_site.admin_view(func)

        # Before the default patterns: their "<path:object_id>/" would swallow these.
        return [
            path("<path:object_id>/export/", view(self.export_view), name=f"{prefix}_export"),
            path("<path:object_id>/clear/", view(self.clear_view), name=f"{prefix}_clear"),
            path(
                "<path:object_id>/summarize/", view(self.summarize_view), name=f"{prefix}_summarize"
            ),
            path("<path:object_id>/reembed/", view(self.reembed_view), name=f"{prefix}_reembed"),
        ] + super().get_urls()

    def _session_or_404(self, request: HttpRequest, object_id: str) -> Session:
        session = self.get_object(request, unquote(object_id))
        if session is None:
            raise Http404("No such session")
        return session

    def _change_url(self, session: Session) -> str:
        return reverse(
            "admin:memory_app_session_change",
            args=[quote(session.pk)],
            current_app=self.admin_site.name,
        )

    @_reported(_to_session)
    def export_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        session = self._session_or_404(request, object_id)
        if not self.has_view_permission(request, session):
            raise PermissionDenied
        return _download(SessionMemory(session).export(), _export_name(session))

    @_reported(_to_session)
    def clear_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        session = self._session_or_404(request, object_id)
        if not self.has_delete_permission(request, session):
            raise PermissionDenied
        if request.method == "POST" and request.POST.get("post") == "yes":
            self._clear([session], request)
            return HttpResponseRedirect(self._change_url(session))
        return self._clear_confirmation(request, [session], single=True)

    @_reported(_to_session)
    def summarize_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._enqueue_view(
            request, object_id, SessionMemory.schedule_summary, "Summarization"
        )

    @_reported(_to_session)
    def reembed_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._enqueue_view(
            request, object_id, SessionMemory.schedule_reembedding, "Re-embedding"
        )

    def _enqueue_view(self, request, object_id, schedule, what) -> HttpResponse:
        if request.method != "POST":
            return HttpResponse(status=405, headers={"Allow": "POST"})
        session = self._session_or_404(request, object_id)
        if not self.has_change_permission(request, session):
            raise PermissionDenied
        self._enqueue_and_report(request, schedule, what, [session])
        return HttpResponseRedirect(self._change_url(session))

    # -- actions -----------------------------------------------------------------------------
    @admin.action(description="Summarize now", permissions=["change"])
    def summarize_now(self, request, queryset):
        self._enqueue_and_report(
            request, SessionMemory.schedule_summary, "Summarization", list(queryset)
        )

    @admin.action(description="Re-embed messages", permissions=["change"])
    def reembed(self, request, queryset):
        self._enqueue_and_report(
            request, SessionMemory.schedule_reembedding, "Re-embedding", list(queryset)
        )

    @admin.action(description="Export selected sessions as JSON", permissions=["view"])
    def export_json(self, request, queryset):
        exports = [SessionMemory(session).export() for session in queryset]
        stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
        return _download(exports, f"sessions-{stamp}.json")

    @admin.action(description="Clear selected sessions…", permissions=["delete"])
    def clear_sessions(self, request, queryset):
        sessions = list(queryset)
        if request.POST.get("post") == "yes":
            self._clear(sessions, request)
            return None
        return self._clear_confirmation(request, sessions, single=False)

    def _enqueue_and_report(
        self,
        request,
        schedule: Callable[[SessionMemory], Scheduled],
        what: str,
        sessions: list[Session],
    ) -> None:
        """Schedule the work for each session (the one way: ``services.background``) and say
        what happened: queued, ran inline (and what it did), already pending, or failed."""
        outcomes = [(session, schedule(SessionMemory(session))) for session in sessions]
        failed = [(s, o) for s, o in outcomes if o.state == "failed"]
        for session, outcome in failed:
            self.message_user(
                request,
                f"{what} of “{session}” could not be scheduled: {outcome.error}",
                messages.ERROR,
            )
        done = [(s, o) for s, o in outcomes if o.state != "failed"]
        if not done:
            return
        if len(done) == 1:
            session, outcome = done[0]
            text = f"{what} of “{session}”: {_describe(outcome)}"
        else:
            states = {}
            for _, outcome in done:
                states[outcome.state] = states.get(outcome.state, 0) + 1
            text = f"{what} of {len(done)} sessions: " + ", ".join(
                f"{n} {_STATE_WORDS[state]}" for state, n in sorted(states.items())
            )
        self.message_user(request, text, messages.SUCCESS)

    def _clear(self, sessions: list[Session], request: HttpRequest) -> None:
        cleared = 0
        for session in sessions:
            try:
                SessionMemory(session).clear()
            except MemoryStoreError as err:  # e.g. deleted meanwhile
                self.message_user(request, f"“{session}” was not cleared: {err}", messages.WARNING)
                continue
            self.log_change(
                request, session, "Cleared messages, snapshots, embeddings and metadata."
            )
            cleared += 1
        if cleared:
            self.message_user(
                request,
                f"Cleared {cleared} {model_ngettext(self.opts, cleared)}.",
                messages.SUCCESS,
            )

    def _clear_confirmation(
        self, request, sessions: list[Session], *, single: bool
    ) -> TemplateResponse:
        ids = [s.pk for s in sessions]
        context = {
            **self.admin_site.each_context(request),
            "title": "Are you sure?",
            "subtitle": str(sessions[0]) if single else None,
            "opts": self.opts,
            "sessions": sessions,
            "single": single,
            "object": sessions[0] if single else None,
            "messages_total": sum(s.message_count for s in sessions),
            "tokens_total": sum(s.token_count for s in sessions),
            "snapshots_total": Snapshot.objects.filter(session__in=ids).count(),
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(
            request, "admin/memory_app/session/clear_confirmation.html", context
        )


_STATE_WORDS = {"queued": "queued", "ran": "done now (no broker)", "pending": "already pending"}


def _describe(outcome: Scheduled) -> str:
    if outcome.state == "queued":
        return f"queued (task {outcome.task_id})."
    if outcome.state == "pending":
        return "a run is already queued or running."
    result = outcome.result
    if isinstance(result, dict):
        return (
            f"done now (no broker): snapshot v{result['version']} covers up to #{result['upto']}."
        )
    if isinstance(result, int):
        return f"done now (no broker): {result} message(s) embedded."
    return "nothing to do yet (no messages to cover)."


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except (ValueError, TypeError):
        return False
    return True


# -- helpers for the transcript page ---------------------------------------------------------
def _page_request(request: HttpRequest) -> tuple[int | None, int | None]:
    """``(after, before)`` from the query string; ``at=C`` means the page starting at C.

    Each is a cursor by the rule book (``validation.check_cursor``: a whole number from 0 to
    the largest the log can hold), so a huge or negative one is an ``InvalidCursor`` here
    rather than in the database.
    """

    def cursor(name: str) -> int | None:
        raw = request.GET.get(name, "").strip()
        if raw == "":
            return None
        return validation.check_cursor(raw, name)

    at, after, before = cursor("at"), cursor("after"), cursor("before")
    if at is not None:
        return max(at - 1, 0), None
    if after is not None:
        return after, None
    if before is not None and before < 1:
        raise InvalidCursor("before must be at least 1", field="before")
    return None, before


def _select_page(
    memory: SessionMemory, size: int, after: int | None, before: int | None
) -> tuple[list, int | None, int | None]:
    """``(messages, previous cursor, next cursor)`` of the page after ``after`` or before
    ``before`` (the newest page when neither is given)."""
    if after is not None:
        found = memory.messages(after=after, limit=size + 1)
        page, following = found[:size], found[size:]
        next_cursor = following[0].cursor if following else None
        edge = page[0].cursor if page else after + 1
        earlier = memory.messages(before=edge, limit=1) if edge <= validation.MAX_CURSOR else []
        previous_cursor = earlier[0].cursor if earlier else None
        return page, previous_cursor, next_cursor
    found = memory.messages(before=before, limit=size + 1) if before else memory.last(size + 1)
    if len(found) > size:
        previous_cursor, page = found[0].cursor, found[1:]
    else:
        previous_cursor, page = None, found
    if before is None:
        next_cursor = None
    else:
        later = memory.messages(after=(page[-1].cursor if page else before - 1), limit=1)
        next_cursor = later[0].cursor if later else None
    return page, previous_cursor, next_cursor


def _unreadable_transcript(request: HttpRequest, error: str) -> dict[str, Any]:
    """The transcript context of a session whose messages cannot be read: an empty page."""
    return {
        "transcript": arrange([], [], previous=None, next=None),
        "lineage": [],
        "lineage_total": 0,
        "lineage_hidden": 0,
        "latest_snapshot": None,
        "stored_range": None,
        "coverage_bar": None,
        "pager": dict.fromkeys(("oldest", "older", "newer", "newest")),
        "cursor_error": f"The transcript cannot be shown: {error}",
        "requested_after": None,
        "page_size": 0,
        "preserved_query": _preserved(request),
    }


_PAGE_PARAMS = {"after", "before", "at"}


def _preserved(request: HttpRequest) -> list[tuple[str, str]]:
    """Query parameters other than the page's (e.g. the changelist filters to return to)."""
    return [(k, v) for k, values in request.GET.lists() if k not in _PAGE_PARAMS for v in values]


def _link(request: HttpRequest, **params: int) -> str:
    return "?" + urlencode(_preserved(request) + list(params.items()))


def _pager_links(request: HttpRequest, page: Page) -> dict[str, str | None]:
    return {
        "oldest": _link(request, after=0) if page.has_older else None,
        "older": _link(request, before=page.first) if page.has_older else None,
        "newer": _link(request, after=page.last) if page.has_newer else None,
        "newest": _link(request) if page.has_newer else None,
    }


def _coverage_bar(
    ranges, page: Page, saved: int, stored: tuple[int, int] | None
) -> dict[str, Any] | None:
    """Positions (in % of every cursor handed out) of each snapshot's range, of the cursors no
    longer stored, and of this page."""
    if saved <= 0:
        return None

    def span(first: int, last: int) -> dict[str, float]:
        left = (first - 1) / saved * 100
        return {
            "left": round(left, 3),
            "width": round(max((last - first + 1) / saved * 100, 0.4), 3),
        }

    segments = [
        {
            **span(r.first, r.snapshot.upto),
            "version": r.snapshot.version,
            "first": r.first,
            "upto": r.snapshot.upto,
        }
        for r in ranges
    ]
    window = span(page.first, page.last) if page.first is not None else None
    gone_upto = saved if stored is None else stored[0] - 1
    gone = {**span(1, gone_upto), "upto": gone_upto} if gone_upto > 0 else None
    return {"segments": segments, "gone": gone, "window": window, "saved": saved}


# ---- LangGraph state and store items: read-only pages --------------------------------------------
def _checkpoints_link(session: Session) -> dict[str, Any] | None:
    """How many LangGraph checkpoints the session holds (it is a thread), and where they are."""
    count = Checkpoint.objects.filter(session=session).count()
    if not count:
        return None
    url = reverse("admin:memory_app_checkpoint_changelist")
    return {"count": count, "url": f"{url}?{urlencode({'session': str(session.pk)})}"}


class ThreadFilter(admin.SimpleListFilter):
    """``?session=<id>``: one thread's checkpoints (the session page links here). Only the
    chosen thread is listed: a sidebar of every thread would not scale."""

    title = "thread"
    parameter_name = "session"

    def lookups(self, request, model_admin):
        value = self.value()
        if not value or not _is_uuid(value):
            return []
        session = Session.objects.filter(pk=value).only("key", "title").first()
        return [(value, str(session))] if session else []

    def queryset(self, request, queryset):
        value = self.value()
        return queryset.filter(session_id=value) if value and _is_uuid(value) else queryset


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows the framework integrations write: looked at here, changed only through them."""

    show_full_result_count = False
    list_per_page = 50

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


def _size(data: Any) -> str:
    return "none" if data is None else f"{len(bytes(data))} bytes"


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyAdmin):
    """A thread's LangGraph checkpoints, newest first, each with its pending writes."""

    list_display = (
        "checkpoint_id",
        "thread",
        "display_ns",
        "step",
        "source",
        "writes",
        "created_at",
    )
    list_filter = (ThreadFilter,)
    search_fields = ("checkpoint_id", "run_id")
    ordering = ("-checkpoint_id",)
    list_select_related = ("session",)
    fields = (
        ("session", "checkpoint_ns"),
        ("checkpoint_id", "parent_checkpoint_id"),
        ("run_id", "created_at"),
        "metadata",
        "channel_values",
        "pending_writes",
        "checkpoint",
    )
    readonly_fields = fields[3:] + ("session", "checkpoint_ns", "checkpoint_id")
    readonly_fields += ("parent_checkpoint_id", "run_id", "created_at")

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        writes = CheckpointWrite.objects.filter(
            session=OuterRef("session"),
            checkpoint_ns=OuterRef("checkpoint_ns"),
            checkpoint_id=OuterRef("checkpoint_id"),
        )
        return (
            super()
            .get_queryset(request)
            .annotate(
                write_count=Subquery(
                    writes.values("checkpoint_id").annotate(n=Count("pk")).values("n")[:1]
                )
            )
        )

    @admin.display(description="thread")
    def thread(self, obj: Checkpoint) -> str:
        return obj.session.key

    @admin.display(description="namespace")
    def display_ns(self, obj: Checkpoint) -> str:
        return obj.checkpoint_ns or "(root)"

    @admin.display(description="step")
    def step(self, obj: Checkpoint) -> Any:
        return (obj.metadata or {}).get("step", "")

    @admin.display(description="source")
    def source(self, obj: Checkpoint) -> Any:
        return (obj.metadata or {}).get("source", "")

    @admin.display(description="pending writes")
    def writes(self, obj: Checkpoint) -> int:
        return obj.write_count or 0

    @admin.display(description="channel values")
    def channel_values(self, obj: Checkpoint) -> str:
        versions = obj.checkpoint.get("channel_versions") or {}
        stored = {
            (b.channel, b.version): b
            for b in CheckpointBlob.objects.filter(
                session=obj.session_id, checkpoint_ns=obj.checkpoint_ns, channel__in=list(versions)
            )
        }
        rows = []
        for channel, version in sorted(versions.items()):
            blob = stored.get((channel, str(version)))
            rows.append(
                (channel, version, blob.type if blob else "missing", _size(blob and blob.blob))
            )
        if not rows:
            return "none"
        return format_html(
            "<table><tr><th>channel</th><th>version</th><th>type</th><th>size</th></tr>{}</table>",
            format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", rows),
        )

    @admin.display(description="pending writes")
    def pending_writes(self, obj: Checkpoint) -> str:
        rows = [
            (w.task_id, w.task_path, w.idx, w.channel, w.type, _size(w.blob))
            for w in CheckpointWrite.objects.filter(
                session=obj.session_id,
                checkpoint_ns=obj.checkpoint_ns,
                checkpoint_id=obj.checkpoint_id,
            ).order_by("task_path", "task_id", "idx")
        ]
        if not rows:
            return "none"
        return format_html(
            "<table><tr><th>task</th><th>path</th><th>idx</th><th>channel</th><th>type</th>"
            "<th>size</th></tr>{}</table>",
            format_html_join(
                "",
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                rows,
            ),
        )


@admin.register(Item)
class ItemAdmin(ReadOnlyAdmin):
    """An owner's store items (LangGraph's store, remembered facts), with their provenance."""

    list_display = ("namespace", "key", "owner", "kind", "updated_at", "expires_at", "invalid_at")
    list_filter = ("kind", ("owner", admin.RelatedOnlyFieldListFilter))
    search_fields = ("namespace", "key")
    ordering = ("-updated_at",)
    list_select_related = ("owner",)
    fields = (
        ("owner", "kind"),
        ("namespace", "key"),
        "value",
        ("session", "source_cursors", "importance"),
        ("valid_from", "invalid_at"),
        ("created_at", "updated_at"),
        ("expires_at", "ttl_minutes"),
        "embedding_model",
    )
    readonly_fields = (
        "owner",
        "kind",
        "namespace",
        "key",
        "value",
        "session",
        "source_cursors",
        "importance",
        "valid_from",
        "invalid_at",
        "created_at",
        "updated_at",
        "expires_at",
        "ttl_minutes",
        "embedding_model",
    )


class InForceFilter(admin.SimpleListFilter):
    title = "in force"
    parameter_name = "in_force"

    def lookups(self, request, model_admin):
        return (
            ("yes", "In force"),
            ("superseded", "Superseded"),
            ("retired", "Retired"),
            ("evicted", "Evicted"),
        )

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(invalid_at__isnull=True)
        if self.value() in ("superseded", "retired", "evicted"):
            return queryset.filter(invalid_at__isnull=False, value__ended=self.value())
        return queryset


@admin.register(LearnedMemory)
class LearnedMemoryAdmin(ReadOnlyAdmin):
    """An owner's learned memories: each fact with where it came from and when it was in force;
    a memory's page lists every version of it (its history), each with its source messages."""

    list_display = (
        "display_text",
        "owner",
        "display_importance",
        "valid_from",
        "display_state",
        "display_source",
    )
    list_filter = (InForceFilter, ("owner", admin.RelatedOnlyFieldListFilter))
    search_fields = ("key", "value__text")
    search_help_text = "Searches the facts' text and keys."
    ordering = ("-valid_from",)
    list_select_related = ("owner", "session")
    date_hierarchy = "valid_from"
    fields = (
        ("owner", "key"),
        "display_text",
        ("display_importance", "display_state"),
        ("valid_from", "invalid_at"),
        "display_source",
        "display_history",
    )
    readonly_fields = (
        "owner",
        "key",
        "display_text",
        "display_importance",
        "display_state",
        "valid_from",
        "invalid_at",
        "display_source",
        "display_history",
    )

    class Media:
        css = {"all": ("memory_app/admin.css",)}

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).filter(kind=memories.KIND)

    @admin.display(description="fact")
    def display_text(self, obj: Item) -> str:
        view = memories.view(obj)
        topic = format_html(' <span class="mem-pill">{}</span>', view.topic) if view.topic else ""
        return format_html('<span class="mem-title">{}</span>{}', view.text, topic)

    @admin.display(description="importance", ordering="importance")
    def display_importance(self, obj: Item) -> str:
        if obj.importance is None:
            return "—"
        confirmed = memories.view(obj).confirmations
        extra = f" · found again {confirmed}×" if confirmed else ""
        return f"{obj.importance:.2f}{extra}"

    @admin.display(description="state", ordering="invalid_at")
    def display_state(self, obj: Item) -> str:
        if obj.invalid_at is None:
            return format_html('<span class="mem-pill mem-pill-snap">{}</span>', "in force")
        ended = memories.view(obj).ended or "ended"
        return format_html(
            '<span class="mem-quiet" title="{}">{} {}</span>',
            obj.invalid_at.isoformat(),
            ended,
            obj.invalid_at.strftime("%Y-%m-%d %H:%M"),
        )

    @admin.display(description="source")
    def display_source(self, obj: Item) -> str:
        return _memory_source(obj)

    @admin.display(description="history")
    def display_history(self, obj: Item) -> str:
        versions = memories.history(obj.owner_id, obj.key)
        rows = format_html_join(
            "",
            "<tr{}><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    format_html(' class="{}"', "mem-current") if v.id == obj.pk else "",
                    v.valid_from.strftime("%Y-%m-%d %H:%M"),
                    f"{v.invalid_at:%Y-%m-%d %H:%M} ({v.ended or 'ended'})"
                    if v.invalid_at
                    else "in force",
                    v.text,
                    _memory_source(v),
                )
                for v in versions
            ),
        )
        return format_html(
            '<table class="mem-history"><thead><tr><th>from</th><th>until</th><th>fact</th>'
            "<th>source</th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )


def _memory_source(memory: Any) -> str:
    """Where a memory came from: its session, linked to the messages' place in the transcript."""
    session_id = memory.session_id
    if session_id is None:
        return format_html('<span class="mem-quiet">{}</span>', "given directly")
    cursors = list(memory.source_cursors or ())
    url = reverse("admin:memory_app_session_change", args=[quote(session_id)])
    if cursors:
        url += f"?at={cursors[0]}#m-{cursors[0]}"
    label = ", ".join(f"#{c}" for c in cursors) or "the session"
    return format_html('<a href="{}">{}</a>', url, label)
