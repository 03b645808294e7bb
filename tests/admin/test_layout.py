"""The admin at a 1280x800 laptop screen, in light and dark mode, as a new user first sees it
(the app sidebar open): every changelist column without horizontal scrolling, the transcript
taking most of the content width, the stat cards in even rows, the bulk confirmations listing
key and owner. Screenshots land in ``test-artifacts/``.
"""

from __future__ import annotations

import pytest

from .test_browser import (  # noqa: F401  (fixtures)
    PASSWORD,
    _async_unsafe_allowed,
    browser,
    sessions,
    shoot,
    staff,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTH, HEIGHT = 1280, 800


@pytest.fixture(params=["light", "dark"])
def scheme(request) -> str:
    return request.param


@pytest.fixture
def laptop(browser, live_server, staff, scheme):  # noqa: F811
    context = browser.new_context(
        viewport={"width": WIDTH, "height": HEIGHT}, color_scheme=scheme, base_url=live_server.url
    )
    page = context.new_page()
    page.set_default_timeout(10_000)
    page.goto("/admin/login/?next=/admin/")
    page.fill("#id_username", "ada")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#site-name")
    yield page
    context.close()


def overflow(page, selector: str) -> dict:
    return page.eval_on_selector(selector, "e => ({scroll: e.scrollWidth, client: e.clientWidth})")


def test_changelist_shows_every_column_without_scrolling(laptop, sessions, scheme):  # noqa: F811
    laptop.goto("/admin/memory_app/session/")
    shoot(laptop, f"changelist-1280-{scheme}.png", full_page=True)
    for column in (
        "display_key",
        "display_title",
        "display_owner",
        "display_namespace",
        "messages",
        "tokens",
        "snapshot",
        "display_updated",
    ):
        header = laptop.locator(f"#result_list th.column-{column}")
        assert header.count() == 1, column
        box = header.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= WIDTH, (column, box)
    results = overflow(laptop, "#changelist .results")
    assert results["scroll"] <= results["client"], results
    document = overflow(laptop, "html")
    assert document["scroll"] <= document["client"], document


def test_transcript_takes_most_of_the_content_width(laptop, sessions, scheme):  # noqa: F811
    trip = sessions
    laptop.goto(f"/admin/memory_app/session/{trip.id}/change/")
    laptop.wait_for_selector("#transcript")
    shoot(laptop, f"transcript-1280-{scheme}.png")
    shoot(laptop, f"transcript-1280-{scheme}-full.png", full_page=True)
    content = laptop.locator("#content").bounding_box()
    transcript = laptop.locator("#transcript").bounding_box()
    lineage = laptop.locator("#snapshots").bounding_box()
    assert transcript["width"] >= 0.6 * content["width"], (transcript, content)
    # The lineage beside it, not pushing anything out of the page.
    assert lineage["x"] >= transcript["x"] + transcript["width"] - 1
    assert lineage["x"] + lineage["width"] <= content["x"] + content["width"] + 1
    document = overflow(laptop, "html")
    assert document["scroll"] <= document["client"], document
    # Tool-call lines are not cut off: their summaries fit in the transcript.
    for summary in laptop.locator("#transcript details.mem-call > summary").all():
        assert summary.evaluate("e => e.scrollWidth <= e.clientWidth + 1")

    # Stat cards: equal widths, and rows as full as they can be (no lone card on a last row).
    cards = [c.bounding_box() for c in laptop.locator(".mem-stats > div").all()]
    widths = {round(c["width"]) for c in cards}
    assert max(widths) - min(widths) <= 2, widths
    rows: dict[int, int] = {}
    for c in cards:
        rows[round(c["y"])] = rows.get(round(c["y"]), 0) + 1
    counts = list(rows.values())
    assert len(set(counts)) == 1, counts  # every row holds the same number of cards


def test_bulk_clear_confirmation_lists_key_and_owner(laptop, sessions, scheme):  # noqa: F811
    laptop.goto("/admin/memory_app/session/")
    for box in laptop.locator("#result_list input.action-select").all():
        box.check()
    laptop.select_option("select[name=action]", "clear_sessions")
    with laptop.expect_navigation():
        laptop.click("button[name=index]")
    rows = laptop.locator("table.mem-confirm-sessions tbody tr")
    assert rows.count() == 5
    text = rows.all_inner_texts()
    assert any("ticket-4410" in t and "bob" in t and "support-bot" in t for t in text)
    assert any("daily-standup" in t and "no owner" in t for t in text)
    document = overflow(laptop, "html")
    assert document["scroll"] <= document["client"], document
    shoot(laptop, f"clear-confirmation-1280-{scheme}.png", full_page=True)
