"""The admin with hostile data, on a 390 px phone and a 1280 px laptop: keys, namespaces and
titles as long as the rule book allows and without a space, unbroken message text, and many
short snapshots side by side. Nothing may widen the page, push a column or the "Edit details"
link off screen, or overlap: the mobile pager's parts, the coverage bar's labels."""

from __future__ import annotations

import pytest

from memory_app import Memory
from memory_app.validation import MAX_KEY, MAX_NAMESPACE, MAX_TITLE

from .test_browser import (  # noqa: F401  (fixtures)
    PASSWORD,
    _async_unsafe_allowed,
    browser,
    sessions,
    shoot,
    staff,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SCREENS = {"phone": (390, 844), "laptop": (1280, 800)}


@pytest.fixture
def hostile(sessions, staff, settings):  # noqa: F811
    """A session an agent could really store: every name at its longest, one unbroken word."""
    settings.MEMORY_APP = {"SUMMARIZE_THRESHOLD_TOKENS": None}  # only the snapshots below
    memory = Memory.session(
        "k" * MAX_KEY, owner=staff, namespace="n" * MAX_NAMESPACE, title="T" * MAX_TITLE
    )
    stored = memory.add_many(
        [{"role": "user", "content": "x" * 5000}]
        + [{"role": "assistant", "content": f"reply {i} " + "y" * 300} for i in range(120)]
    )
    previous = None
    for upto in (3, 5, 8, 9, 10, 40, 41, 42):  # short ranges: narrow segments side by side
        previous = memory.save_snapshot(
            f"summary up to {upto} " + "z" * 400, upto=stored[upto - 1].cursor, prev=previous
        )
    return memory


@pytest.fixture(params=sorted(SCREENS))
def screen(request, browser, live_server, staff):  # noqa: F811
    width, height = SCREENS[request.param]
    context = browser.new_context(
        viewport={"width": width, "height": height}, base_url=live_server.url
    )
    page = context.new_page()
    page.set_default_timeout(10_000)
    page.goto("/admin/login/?next=/admin/")
    page.fill("#id_username", "ada")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_selector("#site-name")
    page.name = request.param
    yield page
    context.close()


def page_width(page) -> int:
    return page.evaluate("document.documentElement.scrollWidth")


def boxes(page, selector: str) -> list[dict]:
    return [b for b in (e.bounding_box() for e in page.locator(selector).all()) if b]


def overlap(a: dict, b: dict) -> bool:
    return (
        a["x"] < b["x"] + b["width"] - 0.5
        and b["x"] < a["x"] + a["width"] - 0.5
        and a["y"] < b["y"] + b["height"] - 0.5
        and b["y"] < a["y"] + a["height"] - 0.5
    )


def test_the_session_list_fits_the_screen(screen, hostile):
    width = screen.viewport_size["width"]
    screen.goto("/admin/memory_app/session/")
    shoot(screen, f"hostile-list-{screen.name}.png", full_page=True)
    assert page_width(screen) <= width
    # Every column shown is on screen (a phone scrolls the table in its own box; a laptop
    # shows every column without scrolling).
    results = screen.locator("#changelist .results").bounding_box()
    assert results["x"] >= 0 and results["x"] + results["width"] <= width + 0.5
    if screen.name == "laptop":
        for header in boxes(screen, "#result_list thead th"):
            assert header["x"] + header["width"] <= width + 0.5, header
    # The long key is cut, its whole value in the tooltip.
    key = screen.locator("#result_list .mem-key", has_text="kkkk").first
    assert key.get_attribute("title") == "k" * MAX_KEY
    assert key.evaluate("e => e.scrollWidth > e.clientWidth")  # shown cut, with an ellipsis


def test_the_session_page_fits_the_screen(screen, hostile):
    width = screen.viewport_size["width"]
    screen.goto(f"/admin/memory_app/session/{hostile.id}/change/?at=60")
    screen.wait_for_selector("#transcript")
    shoot(screen, f"hostile-session-{screen.name}.png", full_page=True)
    assert page_width(screen) <= width
    edit = screen.locator(".mem-edit-link").bounding_box()
    assert edit["x"] >= 0 and edit["x"] + edit["width"] <= width, edit
    header = screen.locator(".mem-header").bounding_box()
    assert header["x"] + header["width"] <= width

    # The pager: its parts side by side or on lines of their own, never on top of each other.
    pager = screen.locator("nav.mem-pager").first
    parts = [p.bounding_box() for p in pager.locator(":scope > *").all()]
    assert len(parts) == 3
    assert not any(overlap(a, b) for i, a in enumerate(parts) for b in parts[i + 1 :]), parts
    links = [link.bounding_box() for link in pager.locator(".mem-page-link").all()]
    assert all(link["height"] < 30 for link in links), links  # "« Oldest" stays on one line

    # The coverage bar: a label is shown only where it fits its segment, so none overlap.
    labels = screen.locator(".mem-coverage-seg .mem-seg-label").all()
    shown = []
    for label in labels:
        if label.evaluate("e => getComputedStyle(e).visibility") == "visible":
            box = label.bounding_box()
            segment = label.locator("xpath=..").bounding_box()
            assert box["x"] >= segment["x"] - 0.5
            assert box["x"] + box["width"] <= segment["x"] + segment["width"] + 0.5
            shown.append(box)
    assert shown, "no snapshot label at all"
    assert len(shown) < len(labels)  # the narrow ones give way
    assert not any(overlap(a, b) for i, a in enumerate(shown) for b in shown[i + 1 :])
    legend = boxes(screen, ".mem-coverage-legend > span")
    assert not any(overlap(a, b) for i, a in enumerate(legend) for b in legend[i + 1 :]), legend
