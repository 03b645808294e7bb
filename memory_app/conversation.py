"""A chat loop for plain ``openai`` SDK users, with the memory store keeping the conversation.

    from openai import OpenAI
    from memory_app import Memory
    from memory_app.conversation import Conversation

    chat = Conversation(Memory.session("chat-42", owner=user), OpenAI(), "gpt-4o-mini",
                        system="You are a helpful assistant.")
    turn = chat.send("Hi, I am Ada.")
    print(turn.reply)

Each turn sends the system prompt (not stored: it is configuration, not conversation), the
session's context (its window within ``max_tokens``: snapshot summary, pinned and system
messages, newest whole tool groups) and the new user message; the user message and the reply
are then appended together, in one atomic ``add_many``. Summarization is not this class's job:
appending fires ``messages_appended``, and the store enqueues it once the session passes
``SUMMARIZE_THRESHOLD_TOKENS``.

Failures are explicit:

- the model call fails (network, 4xx/5xx, timeout): the SDK's exception propagates and nothing
  of the turn is stored;
- the model answered but storing failed (database down, session deleted meanwhile, reply over
  ``MAX_MESSAGE_BYTES``...): ``send`` still returns the ``Turn``, with ``turn.reply`` and
  ``turn.error`` set (and a warning logged). ``turn.persist()`` stores it later without calling
  the model again; the turn's idempotency keys make that exactly-once, however often it is
  retried, even when an earlier attempt did commit but reported an error.
- ``stream`` / ``astream`` yield the reply's text as it comes and store the turn when the
  stream ends. Closing the stream early (``close()``, leaving its ``with`` block, breaking out
  of the loop and dropping it) cancels the turn: the HTTP response is closed and nothing is
  stored. A stream that fails mid-way stores nothing either.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
from asgiref.sync import sync_to_async

from .exceptions import InvalidMessage, UnknownModel
from .memory import SessionMemory
from .tokens import encoding_name_for_model
from .types import StoredMessage
from .validation import check_message

logger = logging.getLogger(__name__)

DEFAULT_CONTEXT_TOKENS = 8000


class Turn:
    """One exchange: the user's text, the model's reply, and whether it is stored.

    ``error`` is the storage error when the reply could not be stored (``None`` otherwise);
    ``stored`` the two stored messages once it is.
    """

    def __init__(self, session: SessionMemory, text: str) -> None:
        self.session = session
        self.text = text
        self.id = uuid.uuid4().hex
        self.reply: str = ""
        self.response: Any = None
        self.error: Exception | None = None
        self.stored: list[StoredMessage] | None = None
        self._reply_metadata: dict[str, Any] = {}
        self._refusal: str | None = None
        self.user_message = check_message({"role": "user", "content": text}).as_openai()

    def __repr__(self) -> str:
        state = (
            "stored" if self.stored else (f"error={self.error!r}" if self.error else "not stored")
        )
        return f"<Turn {self.id} {state} reply={self.reply[:40]!r}>"

    def __str__(self) -> str:
        return self.reply

    @property
    def ok(self) -> bool:
        """The reply is stored."""
        return self.stored is not None

    def messages_to_store(self) -> list[dict[str, Any]]:
        """The user message and the reply, each with the turn's idempotency key."""
        reply: dict[str, Any] = {
            "role": "assistant",
            "content": self.reply,
            "idempotency_key": f"turn-{self.id}-assistant",
            "metadata": self._reply_metadata,
        }
        if self._refusal:
            reply["extra"] = {"refusal": self._refusal}
        return [{**self.user_message, "idempotency_key": f"turn-{self.id}-user"}, reply]

    def persist(self) -> list[StoredMessage]:
        """Store the turn (again): exactly once however often called. Raises if storing fails."""
        try:
            self.stored = self.session.add_many(self.messages_to_store())
        except Exception as err:
            self.error = err
            raise
        self.error = None
        return self.stored

    async def apersist(self) -> list[StoredMessage]:
        return await sync_to_async(self.persist)()

    def _record(
        self,
        *,
        model: str | None,
        response_id: str | None,
        finish_reason: str | None,
        usage: Any = None,
    ) -> None:
        metadata: dict[str, Any] = {
            "model": model,
            "response_id": response_id,
            "finish_reason": finish_reason,
        }
        if usage is not None:
            metadata["usage"] = usage.model_dump(exclude_none=True)
        self._reply_metadata = {k: v for k, v in metadata.items() if v is not None}

    def _take_completion(self, response: Any) -> None:
        self.response = response
        choice = response.choices[0]
        self.reply = choice.message.content or ""
        self._refusal = choice.message.refusal
        self._record(
            model=response.model,
            response_id=response.id,
            finish_reason=choice.finish_reason,
            usage=response.usage,
        )

    def _store_or_keep_error(self) -> None:
        """After a paid-for reply: store it, or keep the error on the turn for the caller."""
        try:
            self.persist()
        except Exception:
            logger.warning(
                "Turn %s of session %s: the reply was not stored; call persist() to retry",
                self.id,
                self.session.id,
                exc_info=True,
            )


class _StreamingTurn(Turn):
    """What the sync and async streamed turns share: the request's options and the chunks."""

    def __init__(self, conversation: Conversation, text: str, options: dict[str, Any]) -> None:
        super().__init__(conversation.session, text)
        self._conversation = conversation
        self._options = options
        self.completed = False
        self._chunks = self._generate()


class StreamedTurn(_StreamingTurn):
    """A ``Turn`` whose reply arrives in pieces: iterate it (once) to get them.

    The request is sent when iteration starts; the turn is stored when the stream ends.
    ``close()`` (or leaving a ``with`` block) before that cancels it: nothing is stored.
    """

    def _generate(self) -> Iterator[str]:
        conversation = self._conversation
        stream = conversation._client_for(sync=True).chat.completions.create(
            model=conversation.model,
            messages=conversation.request_messages(self),
            stream=True,
            **self._options,
        )
        reply = _StreamedReply()
        with stream:  # closing it (cancel) closes the HTTP response
            for chunk in stream:
                text = reply.take(chunk)
                if text:
                    yield text
        reply.finish(self)
        self.completed = True
        self._store_or_keep_error()

    def __iter__(self) -> Iterator[str]:
        return self._chunks

    def __next__(self) -> str:
        return next(self._chunks)

    def close(self) -> None:
        """Cancel the turn if it has not ended: the response is closed and nothing is stored."""
        self._chunks.close()

    def __enter__(self) -> StreamedTurn:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


class AsyncStreamedTurn(_StreamingTurn):
    """The async twin of ``StreamedTurn``: ``async for piece in turn``; ``aclose()`` cancels."""

    async def _generate(self) -> AsyncIterator[str]:
        conversation = self._conversation
        client = conversation._client_for(sync=False)
        messages = await conversation.arequest_messages(self)
        stream = await client.chat.completions.create(
            model=conversation.model, messages=messages, stream=True, **self._options
        )
        reply = _StreamedReply()
        async with stream:
            async for chunk in stream:
                text = reply.take(chunk)
                if text:
                    yield text
        reply.finish(self)
        self.completed = True
        await sync_to_async(self._store_or_keep_error)()

    def __aiter__(self) -> AsyncIterator[str]:
        return self._chunks

    async def __anext__(self) -> str:
        return await self._chunks.__anext__()

    async def aclose(self) -> None:
        """Cancel the turn if it has not ended: the response is closed and nothing is stored."""
        await self._chunks.aclose()

    async def __aenter__(self) -> AsyncStreamedTurn:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()


class _StreamedReply:
    """Gathers a streamed reply: its text pieces, refusal, model, id, finish reason and usage."""

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.refusal = ""
        self.model = self.id = self.finish_reason = None
        self.usage: Any = None

    def take(self, chunk: Any) -> str | None:
        """Note one chunk; returns its text, if any."""
        self.model = chunk.model or self.model
        self.id = chunk.id or self.id
        self.usage = chunk.usage or self.usage
        if not chunk.choices:
            return None
        choice = chunk.choices[0]
        self.finish_reason = choice.finish_reason or self.finish_reason
        self.refusal += choice.delta.refusal or ""
        if choice.delta.content:
            self.pieces.append(choice.delta.content)
        return choice.delta.content

    def finish(self, turn: Turn) -> None:
        turn.reply = "".join(self.pieces)
        turn._refusal = self.refusal or None
        turn._record(
            model=self.model,
            response_id=self.id,
            finish_reason=self.finish_reason,
            usage=self.usage,
        )


class Conversation:
    """A chat with a model whose history is a memory session.

    ``client`` is an ``openai.OpenAI`` (for ``send`` / ``stream``) or ``openai.AsyncOpenAI``
    (for ``asend`` / ``astream``). ``max_tokens`` is the budget of the stored context sent with
    each request (not the reply's length: pass ``max_completion_tokens`` in ``options``).
    ``options`` are further arguments of ``chat.completions.create`` (``temperature``...).
    """

    def __init__(
        self,
        session: SessionMemory,
        client: openai.OpenAI | openai.AsyncOpenAI,
        model: str,
        system: str | None = None,
        max_tokens: int = DEFAULT_CONTEXT_TOKENS,
        options: dict[str, Any] | None = None,
        recall_k: int = 0,
        recall_scope: str = "session",
    ) -> None:
        if system is not None and (not isinstance(system, str) or not system.strip()):
            raise InvalidMessage("system", "the system prompt must be a non-empty string or None")
        self.session = session
        self.client = client
        self.model = model
        self.system = system
        self.max_tokens = max_tokens
        self.options = dict(options or {})
        # recall_k > 0: older messages relevant to each new one are recalled into the context
        # (an untrusted reference block); scope "owner" recalls across the owner's sessions.
        self.recall_k = recall_k
        self.recall_scope = recall_scope

    def __repr__(self) -> str:
        return f"<Conversation {self.session!r} model={self.model!r}>"

    # -- what is sent -------------------------------------------------------------------------
    def context(self, text: str) -> list[dict[str, Any]]:
        """The stored part of the request for a new message ``text``: the session's window
        (snapshot summary first), plus recalled older messages when ``recall_k`` is set."""
        if self.recall_k:
            return self.session.context(
                text,
                max_tokens=self.max_tokens,
                recall_k=self.recall_k,
                model=self._counting_model(),
                scope=self.recall_scope,
            ).messages
        return self.session.window(
            max_tokens=self.max_tokens, model=self._counting_model()
        ).messages

    def _counting_model(self) -> str | None:
        """The chat model, for token counting when its encoding is known; any OpenAI-compatible
        server's model names are accepted here, counted with ``TOKEN_ENCODING`` otherwise."""
        try:
            encoding_name_for_model(self.model)
        except UnknownModel:
            return None
        return self.model

    def request_messages(self, turn: Turn) -> list[dict[str, Any]]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, *self.context(turn.text), turn.user_message]

    async def arequest_messages(self, turn: Turn) -> list[dict[str, Any]]:
        return await sync_to_async(self.request_messages)(turn)

    def _client_for(self, *, sync: bool):
        is_async = isinstance(self.client, openai.AsyncOpenAI)
        if sync and is_async:
            raise TypeError(
                "send() and stream() need an openai.OpenAI client; "
                "with openai.AsyncOpenAI use asend() and astream()"
            )
        if not sync and not is_async:
            raise TypeError(
                "asend() and astream() need an openai.AsyncOpenAI client; "
                "with openai.OpenAI use send() and stream()"
            )
        return self.client

    # -- turns --------------------------------------------------------------------------------
    def send(self, text: str, **options: Any) -> Turn:
        """Ask the model; store the user message and the reply together once it answers.

        Raises the SDK's error if the model call fails (nothing stored). A storage failure
        after that does not raise: see ``Turn.error`` and ``Turn.persist()``.
        """
        client = self._client_for(sync=True)
        turn = Turn(self.session, text)
        response = client.chat.completions.create(
            model=self.model, messages=self.request_messages(turn), **{**self.options, **options}
        )
        turn._take_completion(response)
        turn._store_or_keep_error()
        return turn

    async def asend(self, text: str, **options: Any) -> Turn:
        """The async twin of ``send`` (needs an ``AsyncOpenAI`` client)."""
        client = self._client_for(sync=False)
        turn = Turn(self.session, text)
        response = await client.chat.completions.create(
            model=self.model,
            messages=await self.arequest_messages(turn),
            **{**self.options, **options},
        )
        turn._take_completion(response)
        await sync_to_async(turn._store_or_keep_error)()
        return turn

    def stream(self, text: str, **options: Any) -> StreamedTurn:
        """Iterate the result for the reply's text pieces; the turn is stored when it ends."""
        self._client_for(sync=True)
        return StreamedTurn(self, text, {**self.options, **options})

    def astream(self, text: str, **options: Any) -> AsyncStreamedTurn:
        """``async for`` the result for the reply's pieces; the turn is stored when it ends."""
        self._client_for(sync=False)
        return AsyncStreamedTurn(self, text, {**self.options, **options})
