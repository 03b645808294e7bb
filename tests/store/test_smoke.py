from memory_app import Memory


def test_append_and_read_back(mem):
    stored = mem.add({"role": "user", "content": "hello"})
    assert stored.cursor == 1
    assert [m.content for m in mem.messages()] == ["hello"]
    assert Memory.session("test-session", owner=mem.session.owner, namespace="tests").count() == 1
