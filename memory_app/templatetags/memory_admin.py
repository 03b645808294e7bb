"""Small filters for the admin's session pages."""

from __future__ import annotations

from typing import Any

from django import template

register = template.Library()


@register.filter
def thousands(value: Any) -> str:
    """``12345`` → ``12,345`` (without needing django.contrib.humanize installed)."""
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return "" if value is None else str(value)


@register.filter
def one_line(value: Any, length: int = 120) -> str:
    """Whitespace collapsed and cut to ``length`` characters, for one-line previews."""
    text = " ".join(str(value or "").split())
    return text if len(text) <= int(length) else text[: int(length) - 1].rstrip() + "…"
