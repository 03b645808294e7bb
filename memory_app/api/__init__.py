"""The REST API over the memory store (Django REST framework).

Mount it with ``path("api/memory/", include("memory_app.api.urls"))``. Views are thin: each one
calls the adapter (``memory_app.memory``) and nothing else writes.
"""
