"""Locust users for bench/api_load.py: each appends to its own session and reads its windows.

Run by api_load.py (``locust -f bench/locustfile_api.py --headless ...``), which passes:
``LOAD_CLIENTS`` (a JSON file: ``[{"token", "session_id"}, ...]``, one per simulated user) and
``LOAD_ACKS`` (where to write every acknowledged message: ``[[session_id, cursor, content], ...]``).
"""

from __future__ import annotations

import itertools
import json
import os

from locust import FastHttpUser, constant, events, task

CLIENTS = json.loads(open(os.environ["LOAD_CLIENTS"]).read())
_next_client = itertools.count()
ACKNOWLEDGED: list[tuple[str, int, str]] = []
WORDS = "the user asks about the weather in Oslo and the assistant answers with a forecast "


class MemoryClient(FastHttpUser):
    """A client of the memory API: three appends for every window it reads, no think time."""

    wait_time = constant(0)

    def on_start(self) -> None:
        me = CLIENTS[next(_next_client) % len(CLIENTS)]
        self.session_url = f"/api/memory/sessions/{me['session_id']}/"
        self.session_id = me["session_id"]
        self.headers = {"Authorization": f"Token {me['token']}"}
        self.sent = 0

    @task(3)
    def append(self) -> None:
        self.sent += 1
        content = f"{self.session_id[:8]} message {self.sent}: {WORDS}"
        message = {"role": "user" if self.sent % 2 else "assistant", "content": content}
        with self.client.post(
            self.session_url + "messages/",
            json=message,
            headers=self.headers,
            name="append",
            catch_response=True,
        ) as response:
            if response.status_code == 201:
                ACKNOWLEDGED.append(
                    (self.session_id, response.json()["messages"][0]["cursor"], content)
                )
                response.success()
            else:
                response.failure(f"HTTP {response.status_code}")

    @task(1)
    def window(self) -> None:
        with self.client.get(
            self.session_url + "window/?max_tokens=2000",
            headers=self.headers,
            name="window",
            catch_response=True,
        ) as response:
            if response.status_code == 200 and response.json()["messages"]:
                response.success()
            elif response.status_code == 200 and self.sent == 0:
                response.success()  # nothing appended yet: an empty window is right
            else:
                response.failure(f"HTTP {response.status_code}")


@events.quitting.add_listener
def _write_acknowledged(environment, **kwargs) -> None:
    with open(os.environ["LOAD_ACKS"], "w") as fh:
        json.dump(ACKNOWLEDGED, fh)
