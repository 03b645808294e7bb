"""A LangChain chain whose chat history lives in the Django database.

    python examples/langchain_history.py "Hi, I am Ada."
    python examples/langchain_history.py "What is my name?"   # a new process remembers

The model is a ``RunnableLambda`` over the ``openai`` SDK, so only ``langchain-core`` is needed;
any LangChain chat model (``langchain_openai.ChatOpenAI``...) drops in the same way. Options:
``--session KEY`` (default ``langchain-demo``), ``--clear``. See ``_setup.py`` for the
environment variables.
"""

from __future__ import annotations

import argparse

from _setup import model_name, setup_django


def build_chain():
    from langchain_core.messages import AIMessage
    from langchain_core.messages.utils import convert_to_openai_messages
    from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
    from langchain_core.runnables import RunnableLambda
    from langchain_core.runnables.history import RunnableWithMessageHistory
    from openai import OpenAI

    from memory_app.integrations.langchain import DjangoChatMessageHistory

    client = OpenAI()

    def chat_model(prompt_value) -> AIMessage:
        response = client.chat.completions.create(
            model=model_name(), messages=convert_to_openai_messages(prompt_value.to_messages())
        )
        return AIMessage(
            content=response.choices[0].message.content or "",
            id=response.id,
            response_metadata={"model_name": response.model},
        )

    prompt = ChatPromptTemplate.from_messages(
        [
            ("system", "You are a concise, friendly assistant."),
            MessagesPlaceholder("history"),
            ("human", "{question}"),
        ]
    )
    return RunnableWithMessageHistory(
        prompt | RunnableLambda(chat_model),
        # One history per session id; only the newest 4000 tokens are sent to the model.
        lambda session_id: DjangoChatMessageHistory(
            session_id, namespace="examples", max_tokens=4000
        ),
        input_messages_key="question",
        history_messages_key="history",
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("message")
    parser.add_argument("--session", default="langchain-demo")
    parser.add_argument("--clear", action="store_true")
    args = parser.parse_args(argv)
    setup_django()

    import warnings

    from memory_app.integrations.langchain import DjangoChatMessageHistory

    # LangChain marks RunnableWithMessageHistory deprecated in favour of LangGraph; it still works.
    warnings.filterwarnings("ignore", message=".*RunnableWithMessageHistory.*")
    if args.clear:
        DjangoChatMessageHistory(args.session, namespace="examples").clear()
    answer = build_chain().invoke(
        {"question": args.message}, config={"configurable": {"session_id": args.session}}
    )
    print(answer.content)
    history = DjangoChatMessageHistory(args.session, namespace="examples").messages
    print(f"[{len(history)} messages in session {args.session!r}]")


if __name__ == "__main__":
    main()
