"""The answer for every path under the API prefix that names no endpoint.

Without it Django answers those with its HTML 404 page, and a missing trailing slash with a
301 redirect (a 500 ``RuntimeError`` for a POST under ``DEBUG``: ``APPEND_SLASH`` cannot
redirect a body). Here each is a JSON 404 in the API's one error shape
(``{"detail", "code": "not_found"}``, built by ``memory_app.api.exceptions``); a missing slash
says so and names the URL to use, so a client fixes it instead of following a redirect that
loses its POST body.
"""

from __future__ import annotations

from typing import Any

from django.urls import Resolver404, resolve
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.views import APIView

from .exceptions import memory_exception_handler


@extend_schema(exclude=True)
class NoSuchRoute(APIView):
    """Every method of a path under the API prefix that matches no route: a JSON 404.

    Neither authentication nor permissions apply: there is nothing here to protect, and an
    unknown URL should read as one whoever asks.
    """

    authentication_classes: list = []
    permission_classes: list = []
    throttle_classes: list = []
    renderer_classes = [JSONRenderer]
    http_method_names = ["get", "post", "put", "patch", "delete", "head", "options", "trace"]

    def get_exception_handler(self):
        return memory_exception_handler

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        raise exceptions.NotFound(_detail(request))


def _detail(request: Request) -> str:
    path = request.path_info
    if not path.endswith("/") and _routed(path + "/"):
        right = request.build_absolute_uri(request.path + "/")
        query = request.META.get("QUERY_STRING", "")
        return (
            f"No endpoint at {request.path}: API URLs end with a slash; use {right}"
            + (f"?{query}" if query else "")
            + "."
        )
    return f"No endpoint at {request.path}."


def _routed(path: str) -> bool:
    """Whether ``path`` reaches an endpoint (not this catch-all)."""
    try:
        match = resolve(path)
    except Resolver404:
        return False
    return getattr(match.func, "view_class", None) is not NoSuchRoute
