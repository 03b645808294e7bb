"""Pluggable providers, chosen by dotted path in ``MEMORY_APP``.

- embeddings: turn texts into vectors (``EMBEDDER``): see ``embeddings.py``.
- summarizers: fold messages into a running summary (``SUMMARIZER``): see ``summarizers.py``.
"""
