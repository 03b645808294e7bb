"""The one place where errors become HTTP responses.

Every error body has the same shape: ``{"detail": "...", "code": "..."}``, plus ``field`` (and
``index`` for a message of a batch) and ``errors`` (``{field: [messages]}``) when a field is at
fault, and the versions involved for a snapshot conflict. The adapter's typed errors map to
statuses through the attributes each error class carries (``memory_app.exceptions``); DRF's
own errors (validation, authentication, throttling,
404) are reshaped to the same body; a body over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` is a 413 and an
unavailable database a 503 with ``Retry-After``.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError
from rest_framework import exceptions as drf_exceptions
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from ..exceptions import InvalidMessage, MemoryStoreError, SnapshotConflict

logger = logging.getLogger("memory_app")

#: Seconds a client is asked to wait (Retry-After) when the database is unavailable.
DATABASE_RETRY_AFTER = 1


def memory_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF exception handler of the memory API views (set on the views, not project-wide)."""
    if isinstance(exc, MemoryStoreError):
        return _store_error_response(exc)
    if isinstance(exc, (OperationalError, InterfaceError)):
        # The database is down, restarting or dropped the connection (Django reconnects on the
        # next request): a retryable 503, not a 500. Nothing was half stored: writes are atomic.
        logger.warning("memory API: database unavailable: %s", exc, exc_info=exc)
        return Response(
            {
                "detail": "The database is unavailable; retry shortly.",
                "code": "database_unavailable",
            },
            status=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": str(DATABASE_RETRY_AFTER)},
        )
    if isinstance(exc, RequestDataTooBig):
        # Django raises it on reading a body over DATA_UPLOAD_MAX_MEMORY_SIZE; left alone it
        # would become Django's HTML "400 Bad Request" page.
        return Response(
            {"detail": f"The request body is too large: {exc}", "code": "request_too_large"},
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    response = drf_exception_handler(exc, context)
    if response is None:
        return None  # a real bug: let Django answer 500 and log it
    response.data = _drf_error_body(exc, response.data)
    return response


def _store_error_response(exc: MemoryStoreError) -> Response:
    # Status, code and retry advice live on the error classes (memory_app.exceptions).
    http_status = exc.status_code
    if not exc.client_fault:
        logger.error("memory API: %s", exc, exc_info=exc)
    body: dict[str, Any] = {"detail": str(exc), "code": exc.code}
    field = getattr(exc, "field", None)
    if field:
        body["field"] = field
        body["errors"] = {field: [getattr(exc, "reason", None) or str(exc)]}
    if isinstance(exc, InvalidMessage) and exc.index is not None:
        body["index"] = exc.index
    if isinstance(exc, SnapshotConflict):
        current = exc.current
        body["expected_version"] = exc.expected_version
        body["current_version"] = current.version if current is not None else None
        body["current"] = dataclasses.asdict(current) if current is not None else None
    headers = {}
    if exc.retryable and exc.retry_after is not None:
        headers["Retry-After"] = str(exc.retry_after)
    return Response(body, status=http_status, headers=headers)


def _drf_error_body(exc: Exception, data: Any) -> dict[str, Any]:
    if isinstance(exc, drf_exceptions.ValidationError):
        errors = data if isinstance(data, dict) else {"non_field_errors": data}
        body: dict[str, Any] = {"detail": "Invalid input.", "code": "invalid", "errors": errors}
        field = next((name for name in errors if name != "non_field_errors"), None)
        if field:
            body["field"] = field
            body["detail"] = f"{field}: {_first_message(errors[field])}"
        return body
    if isinstance(exc, drf_exceptions.APIException):
        codes = exc.get_codes()
        return {
            "detail": str(exc.detail),
            "code": codes if isinstance(codes, str) else exc.default_code,
        }
    # Django's Http404 / PermissionDenied, already turned into DRF responses.
    detail = data.get("detail", "") if isinstance(data, dict) else str(data)
    code = (
        "not_found"
        if getattr(detail, "code", None) == "not_found"
        else getattr(detail, "code", "error")
    )
    return {"detail": str(detail), "code": code}


def _first_message(errors: Any) -> str:
    while isinstance(errors, (list, dict)) and errors:
        errors = errors[0] if isinstance(errors, list) else next(iter(errors.values()))
    return str(errors)
