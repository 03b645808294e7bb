"""Conversations for the admin tests and the README screenshot: what an agent really stores."""

from __future__ import annotations

import json

SYSTEM_PROMPT = (
    "You are Atlas, a travel assistant. Use the tools to check facts; never invent prices. "
    "Answer briefly and say which tool told you what."
)

ITINERARY = (
    "\n".join(
        f"Day {day}: " + text
        for day, text in enumerate(
            [
                "Arrive at Oslo Gardermoen, airport express to the city (20 min). "
                "Check in near Aker Brygge.",
                "Morning at the Opera House roof, afternoon ferry to Bygdøy: "
                "Fram and Viking Ship museums.",
                "Train to Bergen on the Bergensbanen (7 h), "
                "one of Europe's most scenic rail lines.",
                "Bryggen wharf and the fish market; Fløibanen funicular up Mount Fløyen at sunset.",
                "Norway in a Nutshell: Flåm railway and a fjord cruise on the Nærøyfjord.",
                "Hike to Trolltunga (start 6 am, 10-12 h round trip), or kayak the Hardangerfjord.",
                "Back to Oslo by night train; brunch at Mathallen, Munch Museum in the afternoon.",
                "Vigeland sculpture park, Holmenkollen ski jump, and a last dinner at Grünerløkka.",
            ],
            start=1,
        )
    )
    + "\n\n"
    + "\n".join(
        f"Budget note {i}: keep receipts for the fjord tours; card payments work everywhere, "
        "cash is rarely needed."
        for i in range(1, 12)
    )
)


def tool_call(call_id: str, name: str, arguments: dict) -> dict:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def trip_conversation() -> list[dict]:
    """A travel-planning chat: system prompt, tool calls with results, a long answer."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {
            "role": "user",
            "content": "I want to spend a week in Norway in June. Where should I start?",
        },
        {
            "role": "assistant",
            "content": "Oslo is the natural start: most international flights land "
            "there. Shall I check the weather and flights for you?",
        },
        {"role": "user", "content": "Yes please, flying from Amsterdam on June 12."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                tool_call("call_weather_1", "get_weather", {"city": "Oslo", "date": "2025-06-12"}),
                tool_call(
                    "call_flights_1",
                    "search_flights",
                    {"from": "AMS", "to": "OSL", "date": "2025-06-12", "passengers": 1},
                ),
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_weather_1",
            "content": json.dumps(
                {
                    "city": "Oslo",
                    "high_c": 21,
                    "low_c": 12,
                    "sky": "partly cloudy",
                    "daylight_hours": 18.6,
                }
            ),
        },
        {
            "role": "tool",
            "tool_call_id": "call_flights_1",
            "content": json.dumps(
                {
                    "results": [
                        {
                            "carrier": "KLM",
                            "flight": "KL1143",
                            "departs": "07:05",
                            "arrives": "08:55",
                            "eur": 142,
                        },
                        {
                            "carrier": "SAS",
                            "flight": "SK822",
                            "departs": "12:40",
                            "arrives": "14:30",
                            "eur": 119,
                        },
                        {
                            "carrier": "Norwegian",
                            "flight": "DY1305",
                            "departs": "18:15",
                            "arrives": "20:05",
                            "eur": 98,
                        },
                    ]
                }
            ),
        },
        {
            "role": "assistant",
            "content": "June 12 in Oslo: 21 °C, partly cloudy, and almost 19 hours of "
            "daylight (get_weather). The cheapest direct flight is Norwegian "
            "DY1305 at 18:15 for €98; SAS SK822 at 12:40 costs €119 "
            "(search_flights).",
        },
        {
            "role": "user",
            "content": "Great. Can you sketch the whole week, with Bergen and a fjord?",
        },
        {"role": "assistant", "content": ITINERARY},
        {
            "role": "user",
            "content": "Book the SAS flight, and remember I am vegetarian.",
            "remember": True,
            "metadata": {"source": "web", "client": "atlas-ui/2.3"},
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                tool_call(
                    "call_book_1",
                    "book_flight",
                    {"flight": "SK822", "date": "2025-06-12", "meal": "vegetarian"},
                ),
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_book_1",
            "content": json.dumps(
                {"status": "confirmed", "pnr": "X7K2QD", "seat": "14C", "meal": "VGML"}
            ),
        },
        {
            "role": "assistant",
            "content": "Booked: SAS SK822 on June 12, seat 14C, vegetarian meal, "
            "booking reference X7K2QD.",
        },
    ]


TRIP_SUMMARY = (
    "The user plans a week in Norway in June, flying from Amsterdam on June 12. Atlas checked the "
    "weather (Oslo 21 °C, partly cloudy) and flights, then proposed an itinerary: Oslo, the Bergen "
    "railway, Norway in a Nutshell, Trolltunga."
)


def chatter(n: int, *, start: int = 0) -> list[dict]:
    """``n`` plain messages alternating user/assistant, numbered so tests can find them."""
    out = []
    for i in range(start, start + n):
        if i % 2 == 0:
            out.append({"role": "user", "content": f"Question {i}: what about option {i}?"})
        else:
            out.append({"role": "assistant", "content": f"Answer {i}: option {i} works."})
    return out
