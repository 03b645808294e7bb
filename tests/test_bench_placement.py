"""The benchmarks' ``--cpus``: the benchmark and the database server pinned while it runs, and
given their CPUs back afterwards (the server serves every other test too)."""

import os
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from bench.common import cpu_placement, libpq_params

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


def _backend_and_postmaster(params) -> tuple[psycopg.Connection, int, int]:
    conn = psycopg.connect(**params, autocommit=True)
    backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    stat = Path(f"/proc/{backend}/stat").read_text()
    return conn, backend, int(stat.rsplit(")", 1)[1].split()[1])


@pytest.fixture
def server():
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL")
    params = libpq_params(connection.settings_dict)
    conn, backend, postmaster = _backend_and_postmaster(params)
    conn.close()
    if not Path(f"/proc/{postmaster}").exists():
        pytest.skip("the database server runs on another machine")
    try:
        os.sched_setaffinity(postmaster, os.sched_getaffinity(postmaster))
    except PermissionError:
        pytest.skip("the database server is another user's")
    return params, postmaster


@pytest.mark.parametrize("placement", ["same", "apart"])
def test_the_benchmark_and_the_server_are_pinned_then_given_their_cpus_back(server, placement):
    params, postmaster = server
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    server_cpus = os.sched_getaffinity(postmaster)
    mine = os.sched_getaffinity(0)
    with cpu_placement(connection.settings_dict, placement) as said:
        assert f"--cpus {placement}" in said
        expected = {cpus[0]} if placement == "same" else {cpus[1]}
        assert os.sched_getaffinity(0) == {cpus[0]}
        assert os.sched_getaffinity(postmaster) == expected
        # A backend forked meanwhile (a new connection) runs where the postmaster does.
        late, backend, _ = _backend_and_postmaster(params)
        assert os.sched_getaffinity(backend) == expected
    try:
        assert os.sched_getaffinity(postmaster) == server_cpus
        assert os.sched_getaffinity(backend) == server_cpus
        assert os.sched_getaffinity(0) == mine
    finally:
        late.close()


def test_left_to_the_os_nothing_is_pinned(server):
    _, postmaster = server
    before = os.sched_getaffinity(postmaster), os.sched_getaffinity(0)
    with cpu_placement(connection.settings_dict, "any") as said:
        assert "not pinned" in said
        assert (os.sched_getaffinity(postmaster), os.sched_getaffinity(0)) == before
