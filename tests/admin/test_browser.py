"""The admin in a real headless Chromium against the live server.

Screenshots of the changelist and the transcript land in ``test-artifacts/``. To refresh the
README's picture as well, run::

    UPDATE_DOCS_SCREENSHOTS=1 pytest tests/admin/test_browser.py -k transcript

which also writes ``docs/img/transcript.png``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from memory_app import Memory
from memory_app.models import Session

from .conftest import fill
from .conversations import chatter

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"
DOCS_IMAGE = ROOT / "docs" / "img" / "transcript.png"
CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="module")
def _async_unsafe_allowed():
    # Playwright's sync API runs an event loop in this thread, which makes Django refuse
    # database calls from it (fixtures, flushes) unless told the thread is really synchronous.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        yield


@pytest.fixture(scope="module")
def browser(_async_unsafe_allowed):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (install Debian's chromium or set CHROMIUM_PATH)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield browser
        browser.close()


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_superuser("ada", "ada@example.com", PASSWORD)


@pytest.fixture
def page(browser, live_server, staff):
    """A logged-in admin page (1440 px wide, like a laptop screen)."""
    context = browser.new_context(
        viewport={"width": 1440, "height": 1000}, accept_downloads=True, base_url=live_server.url
    )
    # Start with the admin's app sidebar folded, as after a click on its « toggle: the pages
    # under test (and the screenshots) get the full width.
    context.add_init_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
    page = context.new_page()
    page.set_default_timeout(10_000)
    page.goto("/admin/login/?next=/admin/")
    page.fill("#id_username", "ada")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#site-name")
    assert "/admin/login" not in page.url
    yield page
    context.close()


def shoot(page, name: str, **kwargs) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), **kwargs)
    return path


def follow(page, locator) -> None:
    """Click a link or button and wait for the page it leads to."""
    with page.expect_navigation():
        locator.click()


def search(page, text: str) -> None:
    page.fill("#searchbar", text)
    with page.expect_navigation():
        page.press("#searchbar", "Enter")


def session_url(memory) -> str:
    return f"/admin/memory_app/session/{memory.id}/change/"


def listed(page) -> list[str]:
    return page.locator(
        "#result_list tbody td.field-display_key, #result_list tbody th.field-display_key"
    ).all_inner_texts()


@pytest.fixture
def sessions(trip, make_user):
    """The trip chat plus a few others, in two namespaces and two owners."""
    bob = make_user("bob")
    for i, topic in enumerate(["refund for order 1182", "password reset", "printer offline"]):
        memory = Memory.session(
            f"ticket-{4410 + i}", owner=bob, namespace="support-bot", title=topic.capitalize()
        )
        memory.add_many(
            [
                {"role": "user", "content": f"Hi, I need help with a {topic}."},
                {"role": "assistant", "content": "Sure, let me look into that."},
            ]
        )
    planner = Memory.session("daily-standup", namespace="planner", title="Stand-up notes")
    fill(planner, chatter(120))
    return trip


def test_changelist_filters_and_searches(page, sessions):
    page.goto("/admin/memory_app/session/")
    assert sorted(listed(page)) == [
        "daily-standup",
        "ticket-4410",
        "ticket-4411",
        "ticket-4412",
        "trip-norway",
    ]
    assert page.locator("#result_list td.field-messages", has_text="120").count() == 1
    shoot(page, "changelist.png", full_page=True)

    follow(page, page.locator("#changelist-filter").get_by_role("link", name="support-bot"))
    assert sorted(listed(page)) == ["ticket-4410", "ticket-4411", "ticket-4412"]
    follow(page, page.locator("#changelist-filter").get_by_role("link", name="All").first)

    follow(
        page,
        page.locator("#changelist-filter details", has_text="By snapshot").get_by_role(
            "link", name="Yes"
        ),
    )
    assert listed(page) == ["trip-norway"]

    page.goto("/admin/memory_app/session/")
    search(page, "DY1305")  # only in a tool result of the trip
    assert listed(page) == ["trip-norway"]
    search(page, "printer")
    assert listed(page) == ["ticket-4412"]


def test_transcript_shows_tool_calls_and_the_snapshot(page, sessions):
    page.goto("/admin/memory_app/session/")
    follow(page, page.get_by_role("link", name="trip-norway"))
    page.wait_for_selector("#transcript")

    system = page.locator("article.mem-role-system")
    assert system.count() == 1 and "always in context" in system.inner_text()
    assert page.locator("article.mem-role-user").count() == 4

    # Two calls in one assistant message, each with its result inside it, closed at first.
    calls = page.locator("#m-5 details.mem-call")
    assert calls.count() == 2
    flights = calls.nth(1)
    assert not flights.evaluate("d => d.open")
    assert (
        "KL1143" in flights.locator(":scope > summary").inner_text()
    )  # one-line preview of the result
    flights.locator(":scope > summary").click()
    assert flights.evaluate("d => d.open")
    assert flights.locator("#m-7").is_visible()
    assert '"carrier": "Norwegian"' in flights.locator(".mem-call-body").inner_text()

    # The long itinerary is folded until asked for.
    itinerary = page.locator("#m-10 details.mem-fold")
    assert "Day 8" not in itinerary.inner_text()
    itinerary.locator(":scope > summary").click()
    assert "Day 8: Vigeland" in itinerary.inner_text()
    itinerary.locator(":scope > summary").click()

    # Snapshot lineage, and its range marked in the transcript.
    lineage = page.locator("#snapshot-1")
    assert "#1 – #10" in lineage.inner_text() and "gpt-4o-mini" in lineage.inner_text()
    assert (
        page.locator("article.mem-covered").count() == 8
    )  # messages 1-10, results nested in calls
    divider = page.locator("#snapshot-end-1")
    assert divider.is_visible() and "stands for #1 – #10" in divider.inner_text()
    box_10, box_div, box_11 = (
        page.locator(s).bounding_box() for s in ("#m-10", "#snapshot-end-1", "#m-11")
    )
    assert box_10["y"] < box_div["y"] < box_11["y"]

    # The picture: the session header, the transcript and the lineage, one short call open.
    flights.locator(":scope > summary").click()
    calls.nth(0).locator(":scope > summary").click()
    page.evaluate("window.scrollTo(0, 0)")
    layout = page.locator(".mem-layout").bounding_box()
    shoot(page, "transcript-full.png", full_page=True)
    path = shoot(
        page,
        "transcript.png",
        full_page=True,
        clip={"x": 0, "y": 0, "width": 1440, "height": layout["y"] + layout["height"] + 24},
    )
    if os.environ.get("UPDATE_DOCS_SCREENSHOTS"):
        DOCS_IMAGE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, DOCS_IMAGE)

    page.get_by_role("button", name="Expand all").click()
    assert page.locator(".mem-log details:not([open])").count() == 0
    page.get_by_role("button", name="Collapse all").click()
    assert page.locator(".mem-log details[open]").count() == 0


def test_paging_through_a_long_transcript(page, make_session):
    memory = make_session("long-run", 260, namespace="planner")
    page.goto(session_url(memory))

    def shown() -> list[int]:
        return [
            int(c)
            for c in page.locator("article.mem-msg").evaluate_all(
                "els => els.map(e => e.dataset.cursor)"
            )
        ]

    assert shown() == list(range(211, 261))
    for expected_first in (161, 111, 61, 11):
        follow(page, page.locator(".mem-pager").first.get_by_role("link", name="‹ Older"))
        assert shown() == list(range(expected_first, expected_first + 50))
    follow(page, page.locator(".mem-pager").first.get_by_role("link", name="‹ Older"))
    assert shown() == list(range(1, 11))
    assert (
        page.locator(".mem-pager").first.get_by_text("‹ Older").get_attribute("aria-disabled")
        == "true"
    )
    follow(page, page.locator(".mem-pager").first.get_by_role("link", name="Newer ›"))
    assert shown() == list(range(11, 61))
    follow(page, page.locator(".mem-pager").last.get_by_role("link", name="Newest »"))
    assert shown() == list(range(211, 261))

    page.fill("input[name=at]", "123")
    with page.expect_navigation():
        page.press("input[name=at]", "Enter")
    assert shown()[0] == 123 and re.search(r"[?&]at=123", page.url)
    assert "#123 – #172" in page.locator(".mem-pager-where").first.inner_text()


def test_export_downloads_json(page, trip):
    page.goto(session_url(trip))
    with page.expect_download() as info:
        page.get_by_role("link", name="Export JSON").click()
    download = info.value
    assert download.suggested_filename == "session-travel-agent-trip-norway.json"
    data = json.loads(Path(download.path()).read_text())
    assert data["format"] == "memory_app.session" and len(data["messages"]) == 14
    assert data["snapshots"][0]["upto"] == 10


def test_clear_asks_for_confirmation(page, trip):
    page.goto(session_url(trip))
    follow(page, page.get_by_role("link", name="Clear…"))
    assert "14 messages" in page.locator("#content").inner_text()
    follow(page, page.get_by_role("link", name="No, take me back"))
    page.wait_for_selector("#transcript")
    assert Session.objects.get(pk=trip.id).message_count == 14

    follow(page, page.get_by_role("link", name="Clear…"))
    follow(page, page.get_by_role("button", name="Yes, clear it"))
    page.wait_for_selector("#transcript")
    assert "Cleared 1 session." in page.locator(".messagelist").inner_text()
    assert "This session holds no messages." in page.locator("#transcript").inner_text()
    assert trip.count() == 0


def test_summarize_now_reports_and_adds_a_snapshot(page, tasks, make_session):
    memory = make_session("chatty", 80, namespace="planner")
    page.goto(session_url(memory))
    assert "No snapshot yet" in page.locator("#snapshots").inner_text()
    follow(page, page.get_by_role("button", name="Summarize now"))
    assert (
        "Summarization of “chatty”: done now (no broker)"
        in page.locator(".messagelist").inner_text()
    )
    snapshot = memory.latest_snapshot()
    assert snapshot is not None
    assert f"#1 – #{snapshot.upto}" in page.locator("#snapshot-1").inner_text()
    assert page.locator(".mem-coverage-seg").count() == 1
