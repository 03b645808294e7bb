"""Pagination of session lists (by ``updated_at``) and of a session's log (by message cursor)."""

from __future__ import annotations

from urllib.parse import urlencode

from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.pagination import CursorPagination

from ..conf import memory_settings
from ..types import StoredMessage


class SessionCursorPagination(CursorPagination):
    """Opaque-cursor pages of sessions, newest first (stable while sessions are added)."""

    ordering = "-updated_at"
    page_size_query_param = "page_size"
    page_size_query_description = "Sessions per page (default API_SESSIONS_PAGE_SIZE)."

    def __init__(self) -> None:
        # Read per request (a paginator is made per view), so override_settings applies.
        self.page_size = memory_settings.API_SESSIONS_PAGE_SIZE
        self.max_page_size = memory_settings.API_SESSIONS_MAX_PAGE_SIZE

    def get_page_size(self, request) -> int:
        # DRF falls back to the default on a bad value; say what is wrong instead.
        if self.page_size_query_param not in request.query_params:
            return self.page_size
        field = serializers.IntegerField(min_value=1, max_value=self.max_page_size)
        try:
            return field.run_validation(request.query_params[self.page_size_query_param])
        except serializers.ValidationError as err:
            raise serializers.ValidationError({self.page_size_query_param: err.detail}) from None

    def decode_cursor(self, request):
        try:
            return super().decode_cursor(request)
        except NotFound:
            # A malformed cursor is bad input (400), not a missing resource.
            raise serializers.ValidationError(
                {self.cursor_query_param: [self.invalid_cursor_message]}
            ) from None


def next_messages_link(
    request,
    page: list[StoredMessage],
    *,
    has_more: bool,
    limit: int,
    after: int | None,
    before: int | None,
) -> str | None:
    """The URL of the page after ``page`` of ``GET messages/``, in the direction of reading.

    Forwards (``after``, optionally bounded by ``before``): the page after the last message.
    Backwards (``before`` alone): the page before the first. Pages are cut at message cursors,
    which are gapless and never reused, so walking the links visits every message once, in order,
    even while others are appended. The link carries only the parameters the server used, never
    anything else the request's query string held.
    """
    if not has_more or not page:
        return None
    if before is not None and after is None:
        query = {"before": page[0].cursor, "limit": limit}
    else:
        query = {"after": page[-1].cursor, "limit": limit}
        if before is not None:
            query["before"] = before
    return f"{request.build_absolute_uri(request.path)}?{urlencode(query)}"
