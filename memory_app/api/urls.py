"""URLs of the REST API. Mount with ``path("api/memory/", include("memory_app.api.urls"))``."""

from rest_framework.routers import SimpleRouter

from .views import SessionViewSet

app_name = "memory_api"

router = SimpleRouter()
router.register("sessions", SessionViewSet, basename="session")

urlpatterns = router.urls
