"""Celery tasks: thin wrappers over the service layer, safe under at-least-once delivery.

With no broker configured the demo project runs them eagerly in-process.
"""

from __future__ import annotations

import logging

from celery import shared_task  # noqa: F401

logger = logging.getLogger(__name__)


# ---- recall: embedding -------------------------------------------------------------------



# ---- summarization (compaction) --------------------------------------------------------------
