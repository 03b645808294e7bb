"""Who may use the API, and whose sessions they see.

Scoping is not a permission check on an object (that would answer 403 and confirm the session
exists): the view asks its permission classes for an *owner scope* and looks sessions up through
the adapter within it, so another owner's session is simply not found (404).
"""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import IsAuthenticated

from ..types import ANY_OWNER


class OwnerScoped(IsAuthenticated):
    """Authenticated users, each seeing only the sessions they own (the default)."""

    def owner_scope(self, request, view) -> Any:
        """The owner whose sessions ``request`` may see: the requesting user."""
        return request.user


class StaffSeesAllOwners(OwnerScoped):
    """Like ``OwnerScoped``, but staff users see (and may change) every owner's sessions.

    Enable it with ``MEMORY_APP = {"API_PERMISSION_CLASSES":
    ["memory_app.api.permissions.StaffSeesAllOwners"]}``. Sessions staff create are still their own.
    """

    def owner_scope(self, request, view) -> Any:
        return ANY_OWNER if request.user.is_staff else request.user
