"""The project's settings with the floor endpoint's URLconf (``bench/floor_site.py``)."""

from project.settings import *  # noqa: F403

ROOT_URLCONF = "bench.floor_site"
