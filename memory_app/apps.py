from importlib.util import find_spec

from django.apps import AppConfig


class MemoryAppConfig(AppConfig):
    name = "memory_app"
    verbose_name = "Conversation memory"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks, receivers  # noqa: F401  (checks registers the system checks)

        # Embedding and summarization after each append commits.
        receivers.connect()
        if find_spec("celery") is not None:
            # Registers the Celery tasks; without Celery, background work runs inline.
            from . import tasks  # noqa: F401
