from django.apps import AppConfig


class MemoryAppConfig(AppConfig):
    name = "memory_app"
    verbose_name = "Conversation memory"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)

        # Summarize sessions that go over the token threshold after an append.
        from .compaction import connect_signals

        connect_signals()

        # Recall: promote important messages and embed new ones after each append commits.
        from .search import on_messages_appended
        from .signals import messages_appended

        messages_appended.connect(on_messages_appended, dispatch_uid="memory_app.search.on_messages_appended")
