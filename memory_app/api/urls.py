"""URLs of the REST API. Mount with ``path("api/memory/", include("memory_app.api.urls"))``.

The last pattern catches every other path under the prefix (unknown routes, a missing trailing
slash), so they answer in the API's JSON error shape rather than with Django's HTML pages.
"""

from django.urls import re_path
from rest_framework.routers import SimpleRouter

from .errors import NoSuchRoute
from .views import BlockViewSet, MemoryViewSet, OwnerViewSet, SessionViewSet

app_name = "memory_api"

router = SimpleRouter()
router.register("sessions", SessionViewSet, basename="session")
router.register("owner", OwnerViewSet, basename="owner")  # owner/export/, owner/erase/
router.register("memories", MemoryViewSet, basename="memory")
router.register("blocks", BlockViewSet, basename="block")

urlpatterns = [
    *router.urls,
    re_path(r"^.*$", NoSuchRoute.as_view(), name="no-such-route"),
]
