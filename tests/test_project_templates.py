"""The demo project's own templates (top-level templates/): the start page and an admin override."""

from __future__ import annotations

from django.core.management import call_command
from django.urls import reverse

from memory_app.models import Session


def links(response) -> dict[str, str]:
    import re

    return dict(re.findall(r'<a id="(link-[\w-]+)" href="([^"]+)"', response.content.decode()))


def test_start_page_links_the_admin_the_api_docs_and_the_demo_session(db, client):
    call_command("memory_demo")
    demo = Session.objects.get(key="demo-trip-planning")
    response = client.get("/")
    assert response.status_code == 200
    assert "start.html" in [t.name for t in response.templates]
    found = links(response)
    assert found == {
        "link-admin": "/admin/",
        "link-api-docs": "/api/docs/",
        "link-demo": reverse("admin:memory_app_session_change", args=[demo.pk]),
    }
    for url in found.values():  # each link leads somewhere (the admin ones to its login)
        assert client.get(url, follow=True).status_code == 200


def test_start_page_without_the_demo_says_how_to_make_it(db, client):
    response = client.get("/")
    assert response.status_code == 200
    assert links(response)["link-demo"] == reverse("admin:memory_app_session_changelist")
    assert "manage.py memory_demo" in response.content.decode()


def test_the_projects_admin_override_is_used(admin_client):
    response = admin_client.get(reverse("admin:index"))
    assert response.status_code == 200
    html = response.content.decode()
    assert "data-demo-override" in html  # the marker of templates/admin/base_site.html
    assert "Conversation memory" in html  # Django's own base_site.html still renders under it
    origins = [t.origin.name for t in response.templates if t.name == "admin/base_site.html"]
    assert any(
        o.endswith("/templates/admin/base_site.html") and "/django/" not in o for o in origins
    )
