"""The summarizer providers: the extractive default and the OpenAI one over the real SDK."""

from __future__ import annotations

import pytest

from memory_app.exceptions import EmptySummary, SummarizerError
from memory_app.providers.summarizers import (
    ExtractiveSummarizer,
    OpenAISummarizer,
    get_summarizer,
    render_transcript,
)
from memory_app.types import StoredMessage


def msg(cursor: int, role: str, content: str = "", **extra) -> StoredMessage:
    return StoredMessage(cursor=cursor, role=role, content=content, **extra)


CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
}


class TestExtractive:
    def test_keeps_the_first_sentence_of_each_turn_and_updates_the_previous_summary(self):
        s = ExtractiveSummarizer()
        first = s.summarize(
            None,
            [
                msg(1, "system", "You are terse."),
                msg(2, "user", "My name is Ada. I live in Oslo."),
                msg(3, "assistant", "Nice to meet you, Ada! How can I help?"),
            ],
        )
        assert first == "user: My name is Ada.\nassistant: Nice to meet you, Ada!"
        second = s.summarize(
            first,
            [
                msg(4, "assistant", "", tool_calls=[CALL]),
                msg(5, "tool", "sunny", tool_call_id="call_1"),
                msg(6, "user", "Thanks\nsecond line"),
            ],
        )
        assert second == first + "\nassistant called weather\nuser: Thanks"

    def test_caps_the_size_dropping_the_oldest_lines(self):
        s = ExtractiveSummarizer(max_chars=60, max_sentence_chars=25)
        summary = s.summarize(None, [msg(i, "user", f"turn {i} " + "x" * 40) for i in range(1, 6)])
        assert len(summary) <= 60
        lines = summary.splitlines()
        assert lines[-1].startswith("user: turn 5")
        assert all(len(line) <= 25 for line in lines)
        assert not any("turn 1" in line for line in lines)

    def test_never_empty(self):
        assert ExtractiveSummarizer().summarize(None, [msg(1, "tool", "x", tool_call_id="c")]) == (
            "(1 earlier messages without text)"
        )

    def test_is_the_default(self, settings):
        settings.MEMORY_APP = {}
        assert isinstance(get_summarizer(), ExtractiveSummarizer)
        settings.MEMORY_APP = {"SUMMARIZER_OPTIONS": {"max_chars": 10}}
        assert get_summarizer().max_chars == 10

    def test_bad_options(self):
        with pytest.raises(ValueError):
            ExtractiveSummarizer(max_chars=0)


def test_transcript_renders_tool_calls_and_results_and_skips_system():
    text = render_transcript(
        [
            msg(1, "system", "secret prompt"),
            msg(2, "user", "weather?", name="ada"),
            msg(3, "assistant", "", tool_calls=[CALL]),
            msg(4, "tool", "sunny", tool_call_id="call_1"),
        ]
    )
    assert text == (
        "user (ada): weather?\n"
        'assistant called tool weather({"city": "Oslo"}) [call_1]\n'
        "tool result [call_1]: sunny"
    )


class TestOpenAI:
    def test_updates_the_previous_summary_with_the_new_messages(self, llm_settings, openai_server):
        openai_server.reply_with("  Ada lives in Oslo and asked about the weather.  ")
        s = get_summarizer()
        assert isinstance(s, OpenAISummarizer) and s.model == "test-summarizer"
        summary = s.summarize("Ada introduced herself.", [msg(5, "user", "Weather in Oslo?")])
        assert summary == "Ada lives in Oslo and asked about the weather."
        [request] = openai_server.requests_to("/chat/completions")
        body = request["body"]
        assert body["model"] == "test-summarizer" and body["max_tokens"] == 200
        assert body["messages"][0]["role"] == "system"
        assert body["messages"][1]["content"] == (
            "Current summary:\nAda introduced herself.\n\nNew messages:\nuser: Weather in Oslo?"
        )

    def test_options_prompt_and_request_options(self, llm_settings, openai_server):
        s = OpenAISummarizer(
            model="m2", prompt="Summarize.", max_tokens=None, request_options={"temperature": 0}
        )
        s.summarize(None, [msg(1, "user", "hi")])
        body = openai_server.requests_to("/chat/completions")[0]["body"]
        assert body["messages"][0] == {"role": "system", "content": "Summarize."}
        assert body["temperature"] == 0 and "max_tokens" not in body
        assert "Current summary:\n(none yet)" in body["messages"][1]["content"]

    def test_a_failed_request_is_a_summarizer_error(self, llm_settings, openai_server):
        openai_server.fail_next(1, status=503)
        with pytest.raises(SummarizerError, match="failed"):
            get_summarizer().summarize(None, [msg(1, "user", "hi")])

    @pytest.mark.parametrize("answer", ["", "   \n"])
    def test_an_empty_answer_is_an_error(self, llm_settings, openai_server, answer):
        openai_server.reply_with(answer)
        with pytest.raises(EmptySummary):
            get_summarizer().summarize(None, [msg(1, "user", "hi")])
