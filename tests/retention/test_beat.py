"""`celery -A project beat` runs the demo's schedule: expired sessions go without anyone asking."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys

import pytest

from memory_app.models import Session
from tests.celery_worker import ROOT, wait_until

from .conftest import make_session

pytestmark = [pytest.mark.celery, pytest.mark.postgres]


def test_beat_runs_the_sweeps_on_a_real_worker(celery_worker, tmp_path):
    expired = [make_session(expires_in=-dt.timedelta(hours=1)).id for _ in range(3)]
    kept = make_session(expires_in=dt.timedelta(hours=1)).id
    log = (tmp_path / "beat.log").open("w")
    beat = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "project",
            "beat",
            "--loglevel=INFO",
            "-s",
            str(tmp_path / "beat-schedule"),
        ],
        cwd=ROOT,
        env={**celery_worker.env, "MEMORY_BEAT_SECONDS": "1"},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    try:
        wait_until(
            lambda: not Session.objects.filter(pk__in=expired).exists(),
            60,
            0.2,
            f"the expired sessions to go:\n{(tmp_path / 'beat.log').read_text()[-2000:]}"
            f"\n{celery_worker.log()[-2000:]}",
        )
        celery_worker.wait_for_log("Task memory_app.prune_expired[")
        celery_worker.wait_for_log("Task memory_app.sweep_summaries[")
        celery_worker.wait_for_log("Task memory_app.sweep_embeddings[")
    finally:
        os.killpg(beat.pid, signal.SIGTERM)
        beat.wait(15)
    assert Session.objects.filter(pk=kept).exists()
    assert "'sessions': 3" in celery_worker.log()  # the task reported what it did
