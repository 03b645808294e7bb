"""Arranging a page of the log for reading: pure logic, no database."""

from memory_app.transcript import FOLD_CHARS, Divider, Entry, arrange, coverage, fold
from memory_app.types import SnapshotView, StoredMessage


def msg(cursor, role="user", content="hi", **kw):
    return StoredMessage(cursor=cursor, role=role, content=content, **kw)


def call(cursor, *ids):
    return msg(
        cursor,
        "assistant",
        "",
        tool_calls=[
            {"id": i, "type": "function", "function": {"name": "lookup", "arguments": '{"q": 1}'}}
            for i in ids
        ],
    )


def result(cursor, call_id, content="ok"):
    return msg(cursor, "tool", content, tool_call_id=call_id)


def snap(version, upto):
    return SnapshotView(version=version, upto=upto, summary=f"summary {version}")


def entries(page):
    return [i for i in page.items if isinstance(i, Entry)]


def test_tool_results_are_shown_inside_their_calls():
    page = arrange(
        [msg(1), call(2, "a", "b"), result(3, "b", "B"), result(4, "a", "A"), msg(5)], []
    )
    shown = entries(page)
    assert [e.cursor for e in shown] == [1, 2, 5]
    calls = shown[1].tool_calls
    assert [(c.id, c.result.cursor) for c in calls] == [("a", 4), ("b", 3)]
    assert calls[0].arguments.is_json and '"q": 1' in calls[0].arguments.text


def test_a_result_whose_call_is_on_an_earlier_page_stands_alone():
    page = arrange([result(7, "x"), msg(8)], [], previous=6)
    first = entries(page)[0]
    assert first.orphan_result and first.role == "tool"


def test_a_call_without_its_result_on_the_page_keeps_an_empty_slot():
    page = arrange([msg(1), call(2, "a")], [], next=3)
    assert entries(page)[1].tool_calls[0].result is None


def test_dividers_sit_after_the_last_message_each_snapshot_covers():
    page = arrange([msg(c) for c in range(1, 9)], [snap(1, 3), snap(2, 6)])
    kinds = [("d", i.snapshot.version) if isinstance(i, Divider) else i.cursor for i in page.items]
    assert kinds == [1, 2, 3, ("d", 1), 4, 5, 6, ("d", 2), 7, 8]
    assert [e.covered_by for e in entries(page)] == [1, 1, 1, 2, 2, 2, None, None]
    assert page.items[3].first == 1 and page.items[7].first == 4


def test_a_boundary_between_pages_shows_once_on_the_later_page():
    snapshots = [snap(1, 5)]
    earlier = arrange([msg(4), msg(5)], snapshots, previous=3, next=6)
    later = arrange([msg(6), msg(7)], snapshots, previous=5)
    assert not any(isinstance(i, Divider) for i in earlier.items)
    assert isinstance(later.items[0], Divider)


def test_pruned_messages_leave_a_gap_note_and_the_divider_before_the_first_kept():
    page = arrange([msg(1, "system"), msg(41), msg(42)], [snap(1, 40)])
    assert [type(i).__name__ for i in page.items] == ["Entry", "Divider", "Entry", "Entry"]
    kept_tail = arrange([msg(41), msg(42)], [snap(1, 40)])
    assert kept_tail.missing_before == 40 and isinstance(kept_tail.items[0], Divider)


def test_a_snapshot_of_the_whole_log_closes_the_last_page():
    page = arrange([msg(1), msg(2)], [snap(1, 2)])
    assert isinstance(page.items[-1], Divider)
    assert arrange([msg(1), msg(2)], [snap(1, 2)], next=3).items[-1].kind == "message"


def test_paging_flags_follow_the_neighbours():
    page = arrange([msg(5), msg(6)], [], previous=4, next=None)
    assert page.has_older and not page.has_newer and page.first == 5 and page.last == 6
    assert arrange([], []).is_empty


def test_long_text_is_folded_with_a_short_preview():
    long = "line\n" * 400
    folded = fold(long)
    assert folded.folded and len(folded.preview) < len(long) and folded.text == long
    assert not fold("x" * (FOLD_CHARS - 1)).folded


def test_multi_part_content_names_what_it_does_not_load():
    message = msg(
        1,
        content="look",
        content_parts=[
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 4096}},
            {"type": "input_audio", "input_audio": {"data": "xx", "format": "wav"}},
        ],
    )
    parts = entries(arrange([message], []))[0].parts
    assert [p.kind for p in parts] == ["text", "image", "audio"]
    assert "inline image" in parts[1].label and "wav" in parts[2].label


def test_coverage_gives_each_version_its_range():
    ranges = coverage([snap(2, 9), snap(1, 4)])
    assert [(r.snapshot.version, r.first, r.snapshot.upto) for r in ranges] == [
        (1, 1, 4),
        (2, 5, 9),
    ]


def test_calls_read_like_calls_and_results_fit_on_one_line():
    page = arrange([call(1, "a"), result(2, "a", '{"ok": true,\n "n": 2}')], [])
    tool_call = entries(page)[0].tool_calls[0]
    assert tool_call.signature == "q=1"
    assert tool_call.result.inline == '{"ok": true, "n": 2}'
