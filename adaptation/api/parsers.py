"""DRF's parsers, with what the database cannot store answered as a 400 naming it (not a 500): a JSON body nested
past Python's recursion limit, a NUL character in any string or key (PostgreSQL's text and jsonb refuse U+0000) of
a JSON, form or multipart body (an uploaded file's name included), and numbers JSON cannot hold (1e400 reads as
infinity, which jsonb refuses)."""

import math

from rest_framework import parsers
from django.http import QueryDict
from rest_framework.exceptions import ParseError


def _refuse_unstorable(value) -> None:
    pending = [value]
    while pending:  # no recursion: the body may nest as deep as the parser allowed
        current = pending.pop()
        if isinstance(current, str) and "\x00" in current:
            raise ParseError("Parse error - text may not contain NUL (\\u0000) characters.")
        if isinstance(current, float) and not math.isfinite(current):
            raise ParseError("JSON parse error - numbers must be finite (1e400 and NaN cannot be stored).")
        if isinstance(current, QueryDict):  # a form's fields: each key with all its values
            pending.extend(current.keys())
            pending.extend(value for values in current.lists() for value in values[1])
        elif isinstance(current, dict):
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


class FormParser(parsers.FormParser):
    def parse(self, stream, media_type=None, parser_context=None):
        data = super().parse(stream, media_type, parser_context)
        _refuse_unstorable(data)
        return data


class MultiPartParser(parsers.MultiPartParser):
    def parse(self, stream, media_type=None, parser_context=None):
        parsed = super().parse(stream, media_type, parser_context)
        _refuse_unstorable(parsed.data)
        _refuse_unstorable([upload.name for upload in parsed.files.values()])
        return parsed
