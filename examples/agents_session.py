"""An OpenAI Agents SDK agent whose conversation lives in the Django database.

Each run is a new process; the session picks up where the last run stopped:

    python examples/agents_session.py "My name is Ada. What is the weather in Oslo?"
    python examples/agents_session.py "What is my name?"

Options: ``--session KEY`` (default ``agents-demo``), ``--clear`` to start over. Browse the stored
transcript in the admin (``python manage.py runserver``, then /admin/). See ``_setup.py`` for
the environment variables (``OPENAI_API_KEY``, ``OPENAI_BASE_URL``, ``OPENAI_MODEL``).
"""

from __future__ import annotations

import argparse
import asyncio

from _setup import model_name, setup_django, uses_openai_platform


def build_agent():
    from agents import Agent, OpenAIChatCompletionsModel, function_tool
    from openai import AsyncOpenAI

    @function_tool
    def get_weather(city: str) -> str:
        """Today's weather in a city."""
        return f"It is sunny and 21 °C in {city}."

    # Chat Completions works with every OpenAI-compatible server, not only OpenAI's.
    model = OpenAIChatCompletionsModel(model=model_name(), openai_client=AsyncOpenAI())
    return Agent(
        name="assistant",
        instructions="You are a concise, friendly assistant.",
        model=model,
        tools=[get_weather],
    )


async def chat(message: str, session_key: str, clear: bool) -> None:
    from agents import Runner

    from memory_app.integrations.agents import MemorySession

    session = await MemorySession.aopen(session_key, namespace="examples")
    if clear:
        await session.clear_session()
    result = await Runner.run(build_agent(), message, session=session)
    print(result.final_output)
    print(f"[{len(await session.get_items())} items in session {session.session_id}]")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("message")
    parser.add_argument("--session", default="agents-demo")
    parser.add_argument("--clear", action="store_true")
    args = parser.parse_args(argv)
    setup_django()
    if not uses_openai_platform():
        from agents import set_tracing_disabled

        set_tracing_disabled(True)  # traces would be uploaded to OpenAI, which this server is not
    asyncio.run(chat(args.message, args.session, args.clear))


if __name__ == "__main__":
    main()
