"""The REST API over the memory store (Django REST framework).

Mount it with ``path("api/memory/", include("memory_app.api.urls"))``. Views are thin: each one
calls the adapter (``memory_app.memory``) and nothing else writes. It needs the ``[api]`` extra.
"""

from django.core.exceptions import ImproperlyConfigured as _ImproperlyConfigured

try:
    import drf_spectacular as _drf_spectacular  # noqa: F401
    import rest_framework as _rest_framework  # noqa: F401
except ImportError as _err:
    raise _ImproperlyConfigured(
        f"memory_app.api needs the {_err.name!r} package, which is not installed: "
        "pip install 'django-memory-app[api]'"
    ) from _err
