"""Celery for the demo project.

With ``CELERY_BROKER_URL`` (or ``REDIS_URL``) tasks go to Redis and a worker; without a broker
(the embedded demo) settings make them run eagerly in-process.
"""

import os

from celery import Celery
from celery.signals import worker_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

app = Celery("project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_init.connect
def _check_memory_settings(**kwargs):
    # A worker runs no system checks: refuse to start with a MEMORY_APP value the tasks would
    # refuse (the same messages `manage.py check` prints).
    from memory_app.conf import memory_settings

    memory_settings.validate()
