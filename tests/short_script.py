"""Run by tests in a separate process: a short script that appends once and ends at once, its
after-append job still waiting (a long gathering delay). The job must run as the interpreter
shuts down, with an embedder that, like a local model, imports ``concurrent.futures.process``
when first used and embeds on a thread pool.

python -m tests.short_script SESSION_ID TEXT
"""

import os
import sys
from concurrent.futures import ThreadPoolExecutor

import django

from memory_app.providers.embeddings import LexicalEmbedder


class PoolEmbedder(LexicalEmbedder):
    def embed(self, texts):
        from concurrent.futures.process import _MAX_WINDOWS_WORKERS  # noqa: F401  (as joblib)

        with ThreadPoolExecutor(max_workers=2) as pool:
            return list(pool.map(lambda text: super(PoolEmbedder, self).embed([text])[0], texts))


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    django.setup()
    from memory_app import Memory
    from memory_app.memory import ANY_OWNER

    Memory.get(sys.argv[1], owner=ANY_OWNER).add({"role": "user", "content": sys.argv[2]})


if __name__ == "__main__":
    main()
