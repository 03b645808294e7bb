"""A chat whose history lives in the Django database, with nothing but the ``openai`` SDK.

    python examples/conversation.py "Hi, I am Ada."
    python examples/conversation.py "What is my name?"     # a new process remembers
    python examples/conversation.py                        # chat interactively (empty line quits)

Options: ``--session KEY`` (default ``conversation-demo``), ``--clear`` to start over,
``--no-stream`` to wait for whole replies. See ``_setup.py`` for the environment variables.
"""

from __future__ import annotations

import argparse
import sys

from _setup import model_name, setup_django


def typed_lines():
    """Lines typed at the prompt, until an empty line or end of input."""
    while True:
        try:
            line = input("> ").strip()
        except EOFError:
            return
        if not line:
            return
        yield line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("message", nargs="*")
    parser.add_argument("--session", default="conversation-demo")
    parser.add_argument("--clear", action="store_true")
    parser.add_argument("--no-stream", action="store_true")
    args = parser.parse_args(argv)
    setup_django()

    from openai import OpenAI

    from memory_app import Memory
    from memory_app.conversation import Conversation

    session = Memory.session(args.session, namespace="examples")
    if args.clear:
        session.clear()
    chat = Conversation(
        session, OpenAI(), model_name(), system="You are a concise, friendly assistant."
    )

    for text in [" ".join(args.message)] if args.message else typed_lines():
        if args.no_stream:
            turn = chat.send(text)
            print(turn.reply)
        else:
            turn = chat.stream(text)
            for piece in turn:
                print(piece, end="", flush=True)
            print()
        if turn.error is not None:
            # The model answered but the database did not take it: try once more, then give up.
            print(f"[not stored: {turn.error}; retrying]", file=sys.stderr)
            turn.persist()
    print(f"[{session.count()} messages in session {session.id}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
