"""DRF's parsers, with what the database cannot store answered as a 400 naming it (not a 500): a JSON body nested
past Python's recursion limit, a NUL character in any string or key (PostgreSQL's text and jsonb refuse U+0000) of
a JSON, form or multipart body (an uploaded file's name included), and numbers JSON cannot hold (1e400 reads as
infinity, which jsonb refuses)."""

import math

from rest_framework import parsers
from django.http import QueryDict
from django.utils.http import parse_header_parameters
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


def _holds_more_than_the_closing_line(parser_context) -> bool:
    meta = parser_context["request"].META
    boundary = parse_header_parameters(meta.get("CONTENT_TYPE", ""))[1].get("boundary", "")
    try:
        length = int(meta.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return False
    return length > len(f"--{boundary}--\r\n")


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
        if not parsed.data and not parsed.files and _holds_more_than_the_closing_line(parser_context):
            # Django skips a part without a named Content-Disposition; a body of only such parts (a JSON array sent
            # as multipart) would otherwise be accepted as an empty form and "update" nothing with a 200.
            raise ParseError("Multipart form parse error - no part of the body is a named form field.")
        _refuse_unstorable(parsed.data)
        _refuse_unstorable([upload.name for upload in parsed.files.values()])
        return parsed
