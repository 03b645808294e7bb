"""Celery for the demo project.

With ``CELERY_BROKER_URL`` (or ``REDIS_URL``) tasks go to Redis and a worker; without a broker
(the embedded demo) settings make them run eagerly in-process.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

app = Celery("project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
