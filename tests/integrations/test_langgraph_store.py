"""DjangoStore: LangGraph's own store tests for its Postgres store, ported to this store (same
operations and expectations; their database fixtures replaced by the test database, their sleeps
by moving ``expires_at``), then what this store adds: owner isolation, erase, hybrid recall,
typed errors."""

from __future__ import annotations

import datetime as dt
import hashlib
import math

import pytest
from django.utils import timezone
from langchain_core.embeddings import Embeddings
from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchOp,
)

from memory_app import Memory
from memory_app.exceptions import InvalidCursor, InvalidItem
from memory_app.integrations.langgraph import DjangoStore
from memory_app.models import Item as StoredItem
from tests.integrations.graphs import run_async

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

TTL_MINUTES = 0.1


class CharacterCounts(Embeddings):
    """A deterministic embedding: how often each character occurs, hashed into ``dims``."""

    def __init__(self, dims: int = 64) -> None:
        self.dims = dims

    def _one(self, text: str) -> list[float]:
        vector = [0.0] * self.dims
        for char in text.lower():
            vector[int(hashlib.md5(char.encode()).hexdigest(), 16) % self.dims] += 1.0
        norm = math.sqrt(sum(x * x for x in vector)) or 1.0
        return [x / norm for x in vector]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self._one(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self._one(text)


@pytest.fixture
def store(user):
    return DjangoStore(owner=user, ttl={"default_ttl": TTL_MINUTES, "refresh_on_read": True})


@pytest.fixture
def vector_store(user):
    embeddings = CharacterCounts(64)
    return DjangoStore(owner=user, index={"dims": embeddings.dims, "embed": embeddings})


def expire_now(namespace: tuple[str, ...], key: str) -> None:
    StoredItem.objects.filter(namespace=".".join(namespace), key=key).update(
        expires_at=timezone.now() - dt.timedelta(minutes=1)
    )


def stored_expiry(namespace: tuple[str, ...], key: str):
    return StoredItem.objects.get(namespace=".".join(namespace), key=key).expires_at


# ---- ported: batches --------------------------------------------------------------------------
def test_batch_order(store):
    store.put(("test", "foo"), "key1", {"data": "value1"})
    store.put(("test", "bar"), "key2", {"data": "value2"})
    results = store.batch(
        [
            GetOp(namespace=("test", "foo"), key="key1"),
            PutOp(namespace=("test", "bar"), key="key2", value={"data": "value2"}),
            SearchOp(namespace_prefix=("test",), filter={"data": "value1"}, limit=10, offset=0),
            ListNamespacesOp(match_conditions=None, max_depth=None, limit=10, offset=0),
            GetOp(namespace=("test",), key="key3"),
        ]
    )
    assert len(results) == 5
    assert isinstance(results[0], Item) and results[0].value == {"data": "value1"}
    assert results[0].key == "key1"
    assert results[1] is None
    assert isinstance(results[2], list) and len(results[2]) == 1
    assert isinstance(results[3], list) and len(results[3]) > 0
    assert results[4] is None

    reordered = store.batch(
        [
            SearchOp(namespace_prefix=("test",), filter=None, limit=5, offset=0),
            GetOp(namespace=("test", "bar"), key="key2"),
            ListNamespacesOp(match_conditions=None, max_depth=None, limit=5, offset=0),
            PutOp(namespace=("test",), key="key3", value={"data": "value3"}),
            GetOp(namespace=("test", "foo"), key="key1"),
        ]
    )
    assert len(reordered[0]) >= 2
    assert reordered[1].value == {"data": "value2"} and reordered[1].key == "key2"
    assert len(reordered[2]) > 0
    assert reordered[3] is None
    assert reordered[4].value == {"data": "value1"}


def test_batch_get_ops(store):
    store.put(("test",), "key1", {"data": "value1"})
    store.put(("test",), "key2", {"data": "value2"})
    results = store.batch(
        [GetOp(("test",), "key1"), GetOp(("test",), "key2"), GetOp(("test",), "key3")]
    )
    assert [r.key if r else None for r in results] == ["key1", "key2", None]


def test_batch_put_ops(store):
    results = store.batch(
        [
            PutOp(("test",), "key1", {"data": "value1"}),
            PutOp(("test",), "key2", {"data": "value2"}),
            PutOp(("test",), "key3", None),
        ]
    )
    assert results == [None, None, None]
    assert store.get(("test",), "key1").value == {"data": "value1"}
    assert store.get(("test",), "key2").value == {"data": "value2"}
    assert store.get(("test",), "key3") is None


def test_batch_search_ops(store):
    for namespace, key, value in [
        (("test", "foo"), "key1", {"data": "value1", "tag": "a"}),
        (("test", "bar"), "key2", {"data": "value2", "tag": "a"}),
        (("test", "baz"), "key3", {"data": "value3", "tag": "b"}),
    ]:
        store.put(namespace, key, value)
    results = store.batch(
        [
            SearchOp(("test",), filter={"tag": "a"}, limit=10, offset=0),
            SearchOp(("test",), filter=None, limit=2, offset=0),
            SearchOp(("test", "foo"), filter=None, limit=10, offset=0),
        ]
    )
    assert len(results[0]) == 2 and all(i.value["tag"] == "a" for i in results[0])
    assert len(results[1]) == 2
    assert [i.namespace for i in results[2]] == [("test", "foo")]


def test_batch_list_namespaces_ops(store):
    data = [
        (("test", "documents", "public"), "doc1", {"content": "public doc"}),
        (("test", "documents", "private"), "doc2", {"content": "private doc"}),
        (("test", "images", "public"), "img1", {"content": "public image"}),
        (("prod", "documents", "public"), "doc3", {"content": "prod doc"}),
    ]
    for namespace, key, value in data:
        store.put(namespace, key, value)
    results = store.batch(
        [
            ListNamespacesOp(match_conditions=None, max_depth=None, limit=10, offset=0),
            ListNamespacesOp(match_conditions=None, max_depth=2, limit=10, offset=0),
            ListNamespacesOp(
                match_conditions=[MatchCondition("suffix", "public")],
                max_depth=None,
                limit=10,
                offset=0,
            ),
        ]
    )
    assert len(results[0]) == len(data)
    assert all(len(ns) <= 2 for ns in results[1])
    assert results[2] and all(ns[-1] == "public" for ns in results[2])


# ---- ported: basic operations and namespaces ----------------------------------------------
def test_basic_store_ops(store):
    namespace = ("test", "documents")
    store.put(namespace, "doc1", {"title": "Test Document", "content": "Hello, World!"})
    item = store.get(namespace, "doc1")
    assert item.namespace == namespace and item.key == "doc1"
    assert item.value == {"title": "Test Document", "content": "Hello, World!"}

    store.put(namespace, "doc1", {"title": "Updated Document", "content": "Hello, Updated!"})
    updated = store.get(namespace, "doc1")
    assert updated.value == {"title": "Updated Document", "content": "Hello, Updated!"}
    assert updated.updated_at > item.updated_at
    assert updated.created_at == item.created_at

    assert store.get(("test", "other_documents"), "doc1") is None
    store.delete(namespace, "doc1")
    assert store.get(namespace, "doc1") is None


def test_list_namespaces(store):
    namespaces = [
        ("test", "documents", "public"),
        ("test", "documents", "private"),
        ("test", "images", "public"),
        ("test", "images", "private"),
        ("prod", "documents", "public"),
        ("prod", "documents", "private"),
    ]
    for namespace in namespaces:
        store.put(namespace, "dummy", {"content": "dummy"})
    assert len(store.list_namespaces()) == len(namespaces)
    test_prefixed = store.list_namespaces(prefix=["test"])
    assert len(test_prefixed) == 4 and all(ns[0] == "test" for ns in test_prefixed)
    public = store.list_namespaces(suffix=["public"])
    assert len(public) == 3 and all(ns[-1] == "public" for ns in public)
    assert all(len(ns) <= 2 for ns in store.list_namespaces(max_depth=2))
    assert len(store.list_namespaces(limit=3)) == 3


def search_namespaces(store, prefix) -> set:
    return {item.namespace for item in store.search(prefix, limit=100)}


def test_search_namespace_segment_boundary(store):
    for namespace in [
        ("foo",),
        ("foo", "child"),
        ("foo", "child", "deep"),
        ("foobar",),
        ("foobar", "baz"),
        ("foo2",),
    ]:
        store.put(namespace, "k", {"v": 1})
    assert search_namespaces(store, ("foo",)) == {
        ("foo",),
        ("foo", "child"),
        ("foo", "child", "deep"),
    }
    assert search_namespaces(store, ("foobar",)) == {("foobar",), ("foobar", "baz")}
    assert search_namespaces(store, ("foo", "child")) == {
        ("foo", "child"),
        ("foo", "child", "deep"),
    }
    assert search_namespaces(store, ("foo2",)) == {("foo2",)}
    assert search_namespaces(store, ("fo",)) == set()


def test_search_empty_prefix_is_unconstrained(store):
    for namespace in [("a",), ("b", "c"), ("d", "e", "f")]:
        store.put(namespace, "k", {"v": 1})
    assert search_namespaces(store, ()) == {("a",), ("b", "c"), ("d", "e", "f")}


def test_search_namespace_like_metacharacters(store):
    for namespace in [("user_1",), ("user_1", "child"), ("userX1",), ("a%b",), ("axxb",)]:
        store.put(namespace, "k", {"v": 1})
    assert search_namespaces(store, ("user_1",)) == {("user_1",), ("user_1", "child")}
    assert search_namespaces(store, ("a%b",)) == {("a%b",)}


def test_list_namespaces_segment_boundary(store):
    for namespace in [
        ("foo",),
        ("foo", "child"),
        ("foobar",),
        ("foobar", "baz"),
        ("uid", "users", "alice"),
        ("uid", "users", "malice"),
        ("uid", "a", "b", "alice"),
    ]:
        store.put(namespace, "k", {"v": 1})
    assert set(store.list_namespaces(prefix=["foo"], limit=100)) == {("foo",), ("foo", "child")}
    assert set(store.list_namespaces(suffix=["alice"], limit=100)) == {
        ("uid", "users", "alice"),
        ("uid", "a", "b", "alice"),
    }
    assert set(store.list_namespaces(prefix=["uid", "*", "alice"], limit=100)) == {
        ("uid", "users", "alice")
    }
    assert set(store.list_namespaces(prefix=["uid"], limit=100)) == {
        ("uid", "users", "alice"),
        ("uid", "users", "malice"),
        ("uid", "a", "b", "alice"),
    }


def test_search(store):
    data = [
        (
            ("test", "docs"),
            "doc1",
            {"title": "First Doc", "author": "Alice", "tags": ["important"]},
        ),
        (("test", "docs"), "doc2", {"title": "Second Doc", "author": "Bob", "tags": ["draft"]}),
        (("test", "images"), "img1", {"title": "Image 1", "author": "Alice", "tags": ["final"]}),
    ]
    for namespace, key, value in data:
        store.put(namespace, key, value)
    assert len(store.search(["test"])) == 3
    docs = store.search(["test", "docs"])
    assert len(docs) == 2 and all(i.namespace == ("test", "docs") for i in docs)
    alice = store.search(["test"], filter={"author": "Alice"})
    assert len(alice) == 2 and all(i.value["author"] == "Alice" for i in alice)
    assert len(store.search(["test"], limit=2)) == 2
    assert len(store.search(["test"], offset=2)) == 1


def test_namespace_labels_with_trailing_newline(store):
    store.put(("users", "alice"), "k", {"v": 1})
    store.put(("users", "alice\n"), "k", {"v": 2})
    assert set(store.list_namespaces(suffix=["alice"], limit=100)) == {("users", "alice")}
    assert set(store.list_namespaces(prefix=["users", "alice"], limit=100)) == {("users", "alice")}


@pytest.mark.parametrize("namespace", [("foo.bar",), ("foo", ""), ("foo", 1)])
@pytest.mark.parametrize("kind", ["get", "put", "delete", "search", "list_prefix", "list_suffix"])
def test_batch_rejects_invalid_namespace_labels(store, namespace, kind):
    op = {
        "get": GetOp(namespace, "key"),
        "put": PutOp(namespace, "key", {"changed": True}),
        "delete": PutOp(namespace, "key", None),
        "search": SearchOp(namespace),
        "list_prefix": ListNamespacesOp((MatchCondition("prefix", namespace),)),
        "list_suffix": ListNamespacesOp((MatchCondition("suffix", namespace),)),
    }[kind]
    store.put(("foo", "bar"), "key", {"original": True})
    with pytest.raises(InvalidNamespaceError) as raised:
        store.batch([PutOp(("valid",), "key", {}), op])
    assert isinstance(raised.value, InvalidItem)  # the rule book's error, typed for both
    assert store.get(("foo", "bar"), "key").value == {"original": True}
    assert store.get(("valid",), "key") is None  # the whole batch is refused before it runs


def test_batch_allows_empty_search_prefix_and_listing_wildcards(store):
    store.put(("foo", "bar"), "key", {"v": 1})
    found, listed = store.batch(
        [SearchOp(()), ListNamespacesOp((MatchCondition("prefix", ("foo", "*")),))]
    )
    assert [item.namespace for item in found] == [("foo", "bar")]
    assert listed == [("foo", "bar")]


# ---- ported: vector search (an index config with its own embeddings) -----------------------
def test_vector_insert_with_auto_embedding(vector_store):
    for key, value in [
        ("doc1", {"text": "short text"}),
        ("doc2", {"text": "longer text document"}),
        ("doc3", {"text": "longest text document here"}),
        ("doc4", {"description": "text in description field"}),
        ("doc5", {"content": "text in content field"}),
        ("doc6", {"body": "text in body field"}),
    ]:
        vector_store.put(("test",), key, value)
    keys = [r.key for r in vector_store.search(("test",), query="long text")]
    assert "doc2" in keys and "doc3" in keys


def test_vector_update_with_embedding(vector_store):
    vector_store.put(("test",), "doc1", {"text": "zany zebra Xerxes"})
    vector_store.put(("test",), "doc2", {"text": "something about dogs"})
    vector_store.put(("test",), "doc3", {"text": "text about birds"})
    initial = vector_store.search(("test",), query="Zany Xerxes")
    assert initial[0].key == "doc1"
    vector_store.put(("test",), "doc1", {"text": "new text about dogs"})
    after = vector_store.search(("test",), query="Zany Xerxes")
    after_score = next((r.score for r in after if r.key == "doc1"), 0.0)
    assert after_score < initial[0].score
    for r in vector_store.search(("test",), query="new text about dogs"):
        if r.key == "doc1":
            assert r.score > after_score
    vector_store.put(("test",), "doc4", {"text": "new text about dogs"}, index=False)
    found = vector_store.search(("test",), query="new text about dogs", limit=3)
    assert not any(r.key == "doc4" for r in found)


@pytest.mark.parametrize("refresh_ttl", [True, False])
def test_vector_search_with_filters(vector_store, refresh_ttl):
    for key, value in [
        ("doc1", {"text": "red apple", "color": "red", "score": 4.5}),
        ("doc2", {"text": "red car", "color": "red", "score": 3.0}),
        ("doc3", {"text": "green apple", "color": "green", "score": 4.0}),
        ("doc4", {"text": "blue car", "color": "blue", "score": 3.5}),
    ]:
        vector_store.put(("test",), key, value)
    found = vector_store.search(
        ("test",), query="apple", filter={"color": "red"}, refresh_ttl=refresh_ttl
    )
    assert [r.key for r in found][:1] == ["doc1"] and len(found) == 2
    found = vector_store.search(
        ("test",), query="car", filter={"color": "red"}, refresh_ttl=refresh_ttl
    )
    assert [r.key for r in found][:1] == ["doc2"] and len(found) == 2
    found = vector_store.search(
        ("test",), query="blue", filter={"score": {"$gt": 3.2}}, refresh_ttl=refresh_ttl
    )
    assert len(found) == 3 and found[0].key == "doc4"
    found = vector_store.search(
        ("test",), query="apple", filter={"score": {"$gte": 4.0}, "color": "green"}
    )
    assert [r.key for r in found] == ["doc3"]


def test_vector_search_pagination(vector_store):
    for i in range(5):
        vector_store.put(("test",), f"doc{i}", {"text": f"test document number {i}"})
    page1 = vector_store.search(("test",), query="test", limit=2)
    page2 = vector_store.search(("test",), query="test", limit=2, offset=2)
    assert len(page1) == 2 and len(page2) == 2 and page1[0].key != page2[0].key
    assert {r.key for r in page1} & {r.key for r in page2} == set()
    assert len(vector_store.search(("test",), query="test", limit=10)) == 5


def test_vector_search_edge_cases(vector_store):
    vector_store.put(("test",), "doc1", {"text": "test document"})
    for query in ("", None, "test " * 100, "test!@#$%^&*()"):
        assert len(vector_store.search(("test",), query=query)) == 1


def test_non_ascii(vector_store):
    texts = ["这是中文", "これは日本語です", "이건 한국어야", "Это русский", "यह रूसी है"]
    for key, text in enumerate(texts, start=1):
        vector_store.put(("user_123", "memories"), str(key), {"text": text})
    for key, text in enumerate(texts, start=1):
        assert vector_store.search(("user_123", "memories"), query=text)[0].key == str(key)


def test_embed_with_path(user):
    embeddings = CharacterCounts(64)
    store = DjangoStore(
        owner=user, index={"dims": 64, "embed": embeddings, "fields": ["key0", "key1"]}
    )
    store.put(("test",), "doc1", {"key0": "xxx", "key1": "yyy", "key2": "aaaaaaaa"})
    store.put(("test",), "doc2", {"key0": "aaaaaaaa", "key1": "yyy"})
    # Only the indexed fields count: doc2's "aaaaaaaa" is indexed, doc1's is not.
    assert store.search(("test",), query="aaaaaaaa", limit=1)[0].key == "doc2"
    # A put's own index fields override the config.
    store.put(("test",), "doc3", {"key0": "zzz", "key2": "qqqqqqqq"}, index=["key2"])
    assert store.search(("test",), query="qqqqqqqq", limit=1)[0].key == "doc3"


# ---- ported: TTL (expiry moved instead of slept for) ----------------------------------------
def test_store_ttl(store):
    ns = ("foo",)
    store.put(ns, key="item1", value={"foo": "bar"}, ttl=TTL_MINUTES)
    first = stored_expiry(ns, "item1")
    assert first is not None
    assert store.get(ns, key="item1", refresh_ttl=True) is not None
    assert stored_expiry(ns, "item1") > first  # read moved it
    moved = stored_expiry(ns, "item1")
    assert len(store.search(ns, query="foo", refresh_ttl=True)) == 1
    assert stored_expiry(ns, "item1") > moved
    kept = stored_expiry(ns, "item1")
    assert store.get(ns, key="item1", refresh_ttl=False) is not None
    assert stored_expiry(ns, "item1") == kept
    expire_now(ns, "item1")
    assert store.search(ns, query="bar", refresh_ttl=False) == []
    assert store.get(ns, key="item1") is None
    assert store.sweep_ttl() == 1
    assert not StoredItem.objects.exists()


def test_expired_items_are_never_read(store):
    store.put(("omit", "expired"), "e", {"data": "gone"}, ttl=TTL_MINUTES)
    store.put(("omit", "control"), "c", {"data": "keep"}, ttl=None)
    expire_now(("omit", "expired"), "e")
    assert StoredItem.objects.filter(key="e").exists()  # not swept yet
    assert store.get(("omit", "expired"), "e") is None
    assert store.get(("omit", "control"), "c") is not None
    assert store.search(("omit", "expired")) == []
    assert [i.key for i in store.search(("omit", "control"))] == ["c"]
    namespaces = store.list_namespaces(prefix=("omit",))
    assert ("omit", "expired") not in namespaces and ("omit", "control") in namespaces


def test_refresh_ttl_only_refreshes_live_rows(store):
    ns = ("refresh",)
    for key in ("expired", "live_get", "live_search"):
        store.put(ns, key, {"n": key}, ttl=TTL_MINUTES)
    expire_now(ns, "expired")
    expired_before = stored_expiry(ns, "expired")
    get_before, search_before = stored_expiry(ns, "live_get"), stored_expiry(ns, "live_search")
    assert store.get(ns, "expired", refresh_ttl=True) is None
    assert "expired" not in [i.key for i in store.search(ns, refresh_ttl=True)]
    assert stored_expiry(ns, "expired") == expired_before
    assert store.get(ns, "live_get", refresh_ttl=True) is not None
    assert stored_expiry(ns, "live_get") > get_before
    assert stored_expiry(ns, "live_search") > search_before


def test_expired_items_do_not_underfill_a_page(store):
    ns = ("page",)
    for key in ("a", "b", "c", "expired"):
        store.put(ns, key, {"k": key}, ttl=TTL_MINUTES)
    expire_now(ns, "expired")
    now = timezone.now()
    for key, seconds in {"a": 1, "expired": 2, "b": 3, "c": 4}.items():
        StoredItem.objects.filter(key=key).update(updated_at=now - dt.timedelta(seconds=seconds))
    assert [i.key for i in store.search(ns, limit=2, offset=0)] == ["a", "b"]
    assert [i.key for i in store.search(ns, limit=2, offset=2)] == ["c"]


# ---- ours: owners, erase, recall, errors, async ---------------------------------------------
def test_another_owner_never_sees_an_item(user, other_user):
    mine = DjangoStore(owner=user)
    theirs = DjangoStore(owner=other_user)
    mine.put(("prefs",), "diet", {"text": "vegetarian"})
    assert theirs.get(("prefs",), "diet") is None
    assert theirs.search(("prefs",), query="vegetarian") == []
    assert theirs.list_namespaces() == []
    theirs.put(("prefs",), "diet", {"text": "vegan"})
    theirs.delete(("prefs",), "diet")
    assert mine.get(("prefs",), "diet").value == {"text": "vegetarian"}
    assert DjangoStore(owner=None).get(("prefs",), "diet") is None


def test_erase_owner_removes_items_and_leaves_others(user, other_user):
    DjangoStore(owner=user).put(("prefs",), "diet", {"text": "vegetarian"})
    DjangoStore(owner=other_user).put(("prefs",), "diet", {"text": "vegan"})
    assert Memory.erase_owner(user).items == 1
    assert not StoredItem.objects.filter(owner=user).exists()
    assert DjangoStore(owner=other_user).get(("prefs",), "diet") is not None


def test_query_search_uses_hybrid_recall_with_the_configured_embedder(user):
    store = DjangoStore(owner=user)  # no index config: the app's embedder and full text
    store.put(("notes",), "1", {"text": "The quarterly report is due on Friday"})
    store.put(("notes",), "2", {"text": "Bring the umbrella, rain tomorrow"})
    store.put(("notes",), "3", {"text": "Xylophone lessons moved to Tuesday"})
    assert store.search(("notes",), query="when is the xylophone lesson?")[0].key == "3"
    assert store.search(("notes",), query="report deadline")[0].key == "1"
    assert all(hit.score is not None for hit in store.search(("notes",), query="rain"))


@pytest.mark.parametrize(
    ("call", "error", "field"),
    [
        (lambda s: s.put(("ns",), "", {"v": 1}), InvalidItem, "key"),
        (lambda s: s.put(("ns",), "k", {"v": "\x00"}), InvalidItem, "value"),
        (lambda s: s.batch([PutOp(("ns",), "k", ["not", "a", "dict"])]), InvalidItem, "value"),
        (lambda s: s.put(("ns",), "k", {"v": 1}, ttl=-1), InvalidItem, "ttl"),
        (lambda s: s.batch([PutOp(("ns",), "k", {"v": 1}, ttl="soon")]), InvalidItem, "ttl"),
        (lambda s: s.search(("ns",), filter={"v": {"$regex": "x"}}), InvalidItem, "filter"),
        (lambda s: s.search(("ns",), filter="v=1"), InvalidItem, "filter"),
        (lambda s: s.search(("ns",), limit=-1), InvalidCursor, "limit"),
        (lambda s: s.batch([GetOp(("a" * 1100,), "k")]), InvalidItem, "namespace"),
    ],
)
def test_bad_input_is_a_typed_error_and_stores_nothing(user, call, error, field):
    store = DjangoStore(owner=user)
    store.put(("ns",), "k0", {"v": 0})
    with pytest.raises(error) as raised:
        call(store)
    assert raised.value.field == field
    assert list(StoredItem.objects.values_list("key", "value")) == [("k0", {"v": 0})]


@pytest.mark.django_db(transaction=True)  # the ORM runs on a worker thread: data is committed
def test_async_batch(user):
    async def scenario():
        store = DjangoStore(owner=user)
        await store.aput(("a",), "k", {"text": "async value"})
        got = await store.aget(("a",), "k")
        found = await store.asearch(("a",), query="async")
        listed = await store.alist_namespaces()
        await store.adelete(("a",), "k")
        return got, found, listed, await store.aget(("a",), "k")

    got, found, listed, gone = run_async(scenario())
    assert got.value == {"text": "async value"}
    assert [i.key for i in found] == ["k"]
    assert listed == [("a",)]
    assert gone is None


def test_the_retention_sweep_deletes_expired_items(store):
    from memory_app.services import retention

    store.put(("t",), "old", {"v": 1}, ttl=TTL_MINUTES)
    store.put(("t",), "forever", {"v": 2}, ttl=None)
    expire_now(("t",), "old")
    assert retention.apply_retention()["items"] == {"expired": 1}
    assert list(StoredItem.objects.values_list("key", flat=True)) == ["forever"]
