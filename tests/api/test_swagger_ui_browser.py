"""Swagger UI renders the API in a real browser with every off-site request blocked."""

from __future__ import annotations

import os
from urllib.parse import urlparse

import pytest

pytestmark = pytest.mark.browser

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"no Chromium at {CHROMIUM}")
def test_swagger_ui_works_offline(live_server):
    from playwright.sync_api import sync_playwright

    local = urlparse(live_server.url).netloc
    off_site: list[str] = []

    def only_local(route):
        if urlparse(route.request.url).netloc == local:
            route.continue_()
        else:
            off_site.append(route.request.url)
            route.abort()

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            page = browser.new_page()
            page.route("**/*", only_local)
            page.goto(f"{live_server.url}/api/docs/")
            page.wait_for_selector(".opblock", timeout=20_000)
            paths = page.locator(".opblock-summary-path").all_inner_texts()
        finally:
            browser.close()
    assert off_site == []
    # 19 session operations, owner export and erase, 5 of memories and 3 of blocks
    assert len(paths) == 29
    assert any("/api/memory/sessions/{id}/snapshot/" in p.replace("\u200b", "") for p in paths)
