"""DRF's JSON parser, with what the database cannot store answered as a 400 naming it (not a 500): a body nested
past Python's recursion limit, a NUL character in any string or key (PostgreSQL's text and jsonb refuse U+0000),
and numbers JSON cannot hold (1e400 reads as infinity, which jsonb refuses)."""

import math

from rest_framework import parsers
from rest_framework.exceptions import ParseError


def _refuse_unstorable(value) -> None:
    pending = [value]
    while pending:  # no recursion: the body may nest as deep as the parser allowed
        current = pending.pop()
        if isinstance(current, str) and "\x00" in current:
            raise ParseError("JSON parse error - text may not contain NUL (\\u0000) characters.")
        if isinstance(current, float) and not math.isfinite(current):
            raise ParseError("JSON parse error - numbers must be finite (1e400 and NaN cannot be stored).")
        if isinstance(current, dict):
            pending.extend(current.keys())
            pending.extend(current.values())
        elif isinstance(current, list):
            pending.extend(current)


class JSONParser(parsers.JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - the body nests too deeply.") from None
        _refuse_unstorable(data)
        return data
