"""Create the demo admin login and a demo conversation to look at (idempotent)."""

from __future__ import annotations

import os

from django.contrib.auth import get_user_model

from memory_app import Memory
from memory_app.management.base import MemoryCommand, username

DEMO_KEY = "demo-trip-planning"

CONVERSATION = [
    {"role": "system", "content": "You are a travel assistant. Use tools for live data."},
    {"role": "user", "content": "Hi! I'm planning a week in Norway in June. My name is Ada."},
    {
        "role": "assistant",
        "content": "Lovely, Ada! June is a great month: long days and mild weather. "
        "Do you prefer cities, fjords or hiking?",
    },
    {"role": "user", "content": "Fjords and some hiking. Please remember I don't eat fish."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_weather_1",
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "arguments": '{"city": "Bergen", "month": "June"}',
                },
            },
            {
                "id": "call_route_1",
                "type": "function",
                "function": {"name": "plan_route", "arguments": '{"from": "Bergen", "to": "Flåm"}'},
            },
        ],
    },
    {
        "role": "tool",
        "tool_call_id": "call_weather_1",
        "content": '{"avg_high_c": 17, "rain_days": 14}',
    },
    {
        "role": "tool",
        "tool_call_id": "call_route_1",
        "content": '{"route": "Bergen → Voss → Myrdal → Flåm", "hours": 5.5}',
    },
    {
        "role": "assistant",
        "content": "Bergen averages 17 °C in June with frequent showers, so pack a rain "
        "jacket. The Bergen → Flåm route via the Flåm Railway takes about "
        "5.5 hours and is spectacular.",
    },
    {"role": "user", "content": "Great. Which hikes near Flåm are good for a beginner?"},
    {
        "role": "assistant",
        "content": "Try the Brekkefossen waterfall hike (1 h return) or the Rallarvegen "
        "path downhill from Myrdal. Both are well marked.",
    },
]


class Command(MemoryCommand):
    help = (
        "Create the admin login (admin / admin unless DEMO_ADMIN_PASSWORD is set) and a demo "
        "session; --user NAME also creates an API user of that name with a demo session of "
        "their own (idempotent)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--user",
            action="append",
            default=[],
            type=username,
            metavar="NAME",
            help="Also create this user (no password: it signs in with an API token, e.g. "
            "`manage.py drf_create_token NAME`) and a demo session they own. Repeatable.",
        )

    def handle(self, *args, **options):
        User = get_user_model()
        chosen = os.environ.get("DEMO_ADMIN_PASSWORD")
        admin, created = User.objects.get_or_create(
            username="admin",
            defaults={"is_staff": True, "is_superuser": True, "email": "admin@example.com"},
        )
        # A new admin gets the chosen password (or "admin"); an existing one only when a password
        # is chosen, so a re-run without DEMO_ADMIN_PASSWORD keeps whatever was set before.
        if created or chosen is not None:
            admin.set_password(chosen if chosen is not None else "admin")
            admin.save()
        password = (
            "(DEMO_ADMIN_PASSWORD)"
            if chosen is not None
            else ("admin" if created else "(unchanged)")
        )
        mem = demo_session(admin)
        self.stdout.write(
            f"Demo ready: log in at /admin/ as admin / {password}; "
            f"session {mem.id} has {mem.count()} messages."
        )
        for name in options["user"]:
            user, made = User.objects.get_or_create(username=name)
            if made:
                user.set_unusable_password()
                user.save(update_fields=["password"])
            mem = demo_session(user)
            self.stdout.write(
                f"User {name} {'created' if made else 'exists'}; their session {mem.id} has "
                f"{mem.count()} messages."
            )


def demo_session(owner):
    """The demo conversation of ``owner``, created with its snapshot when missing."""
    mem = Memory.session(
        DEMO_KEY, owner=owner, namespace="travel-agent", title="Planning a week in Norway"
    )
    if mem.count() == 0:
        stored = mem.add_many(CONVERSATION)
        mem.set_meta("channel", "web")
        mem.save_snapshot(
            "Ada plans a June week in Norway, prefers fjords and hiking, does not eat fish. "
            "Bergen is rainy (17 °C); Bergen → Flåm by rail takes ~5.5 h.",
            upto=stored[7].cursor,
            prev=None,
            model="demo",
            pinned=[CONVERSATION[3]],
        )
    return mem
