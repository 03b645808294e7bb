"""The API's JSON parser: DRF's, with every way a body can be unreadable answered as a 400."""

from __future__ import annotations

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser


class MemoryJSONParser(JSONParser):
    """DRF's ``JSONParser`` (strict: no NaN or Infinity), plus: JSON nested deeper than Python's
    recursion limit (``[[[[...]]]]`` a hundred thousand times) is a parse error, not a
    ``RecursionError`` and a 500. Shallower but still deep data reaches the adapter, which
    refuses what is nested beyond ``MAX_JSON_DEPTH``.

    Bodies over Django's ``DATA_UPLOAD_MAX_MEMORY_SIZE`` never get here: reading them raises
    ``RequestDataTooBig``, which ``memory_exception_handler`` answers with a 413.
    """

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - nested too deeply") from None
