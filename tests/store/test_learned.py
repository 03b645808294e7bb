"""Learned memory on every database the store runs on (PostgreSQL and SQLite): facts kept and
superseded, memory blocks in the window, and recall filters (SQLite's search scans in Python)."""

from __future__ import annotations

from memory_app import Memory


def test_facts_blocks_and_filters(mem, user, django_capture_on_commit_callbacks):
    learned = mem.learned
    fact = learned.remember("Ada is vegetarian", metadata={"since": "2023-01-01"})
    assert learned.remember("Ada is vegetarian").confirmations == 1
    learned.update(fact.key, "Ada is vegan", metadata={"since": "2024-06-01"})
    assert [m.text for m in learned.current()] == ["Ada is vegan"]
    assert [v.ended for v in learned.history(fact.key)] == ["superseded", ""]
    assert [m.text for m in learned.search("vegan food")] == ["Ada is vegan"]
    assert learned.current(filters={"metadata": {"since": {"$lt": "2024-01-01"}}}) == []

    with django_capture_on_commit_callbacks(execute=True):  # indexed for recall
        mem.add_many(
            [
                {"role": "system", "content": "Be kind."},
                {"role": "user", "content": "my cheese order", "metadata": {"n": 3}},
                {"role": "user", "content": "my bread order", "metadata": {"n": 8}},
            ]
        )
    learned.write_block("profile", "Ada, vegan")
    window = mem.window()
    assert [b.name for b in window.blocks] == ["profile"]
    assert (
        window.messages[0]["content"] == "Be kind." and "profile" in window.messages[1]["content"]
    )
    for mode in ("fulltext", "vector"):
        hits = mem.search("order", mode=mode, filters={"metadata": {"n": {"$gte": 5}}})
        assert [r.message.content for r in hits] == ["my bread order"], mode
    assert Memory.learned(None).current() == []
