"""Rate limits of the API, per user, by scope (DRF's throttle machinery)."""

from __future__ import annotations

from rest_framework.permissions import SAFE_METHODS
from rest_framework.throttling import SimpleRateThrottle

from ..conf import memory_settings

READ_SCOPE = "memory_read"
WRITE_SCOPE = "memory_write"


class MemoryScopedRateThrottle(SimpleRateThrottle):
    """Counts reads and writes separately, against ``MEMORY_APP["API_THROTTLE_RATES"]``.

    The scope is the view's ``throttle_scope`` when an action sets one (e.g.
    ``@action(..., throttle_scope="memory_summarize")``), else ``memory_read`` for safe methods
    and ``memory_write`` for the others. Rates are read on each request (not at import, as
    DRF's ``ScopedRateThrottle`` does), so ``override_settings`` applies at once.
    """

    scope: str | None = None

    def get_rate(self) -> str | None:
        if self.scope is None:
            return None
        return (memory_settings.API_THROTTLE_RATES or {}).get(self.scope)

    def allow_request(self, request, view) -> bool:
        self.scope = getattr(view, "throttle_scope", None) or (
            READ_SCOPE if request.method in SAFE_METHODS else WRITE_SCOPE
        )
        self.rate = self.get_rate()
        if self.rate is None:
            return True
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super().allow_request(request, view)

    def get_cache_key(self, request, view) -> str:
        if request.user and request.user.is_authenticated:
            ident = request.user.pk
        else:
            ident = self.get_ident(request)
        return self.cache_format % {"scope": self.scope, "ident": ident}
