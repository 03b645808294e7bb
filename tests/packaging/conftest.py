"""Build the sdist and the wheel once per test session, and install the wheel (not the
checkout) into a fresh virtual environment with the core dependencies only."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def dist_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return out


@pytest.fixture(scope="session")
def wheel(dist_dir) -> Path:
    (found,) = dist_dir.glob("*.whl")
    return found


@pytest.fixture(scope="session")
def core_venv(tmp_path_factory, wheel) -> Path:
    """A new venv (no system site-packages) holding the wheel and what it depends on, nothing else.
    Returns its python."""
    root = tmp_path_factory.mktemp("core-venv")
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(root)
    python = root / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(wheel)],
        check=True,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return python
