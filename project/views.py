"""The demo project's own pages (its templates live in the top-level templates/ directory)."""

from __future__ import annotations

from django.urls import reverse
from django.views.generic import TemplateView

from memory_app.management.commands.memory_demo import DEMO_KEY
from memory_app.models import Session


class StartView(TemplateView):
    """``/``: where to go from here (the admin, the API docs, the demo session)."""

    template_name = "start.html"

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        demo = (
            Session.objects.filter(key=DEMO_KEY, namespace="travel-agent", owner__username="admin")
            .only("pk", "title")
            .first()
        )
        context["demo_session"] = demo
        context["demo_url"] = (
            reverse("admin:memory_app_session_change", args=[demo.pk]) if demo else None
        )
        return context
