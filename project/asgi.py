import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
application = get_asgi_application()

# A server runs no system checks: refuse to start with a MEMORY_APP value the app would refuse
# on every request that reads it (the same messages `manage.py check` prints).
from memory_app.conf import memory_settings  # noqa: E402

memory_settings.validate()
