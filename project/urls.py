from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from .views import StartView

urlpatterns = [
    path("", StartView.as_view(), name="start"),
    path("admin/", admin.site.urls),
]

# --- REST API (memory_app.api) and its OpenAPI schema --------------------------------------------
urlpatterns += [
    path("api/memory/", include("memory_app.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
]

# ---- admin branding (demo project) ----------------------------------------------------------
admin.site.site_header = "Conversation memory"
admin.site.site_title = "Conversation memory"
admin.site.index_title = "Sessions, transcripts and snapshots"
