"""URLs of the REST API. Mount with ``path("api/memory/", include("memory_app.api.urls"))``."""

from rest_framework.routers import SimpleRouter

from .views import OwnerViewSet, SessionViewSet

app_name = "memory_api"

router = SimpleRouter()
router.register("sessions", SessionViewSet, basename="session")
router.register("owner", OwnerViewSet, basename="owner")  # owner/export/, owner/erase/

urlpatterns = router.urls
