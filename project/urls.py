from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("admin/", admin.site.urls),
]

# ---- admin branding (demo project) ----------------------------------------------------------
admin.site.site_header = "Conversation memory"
admin.site.site_title = "Conversation memory"
admin.site.index_title = "Sessions, transcripts and snapshots"
