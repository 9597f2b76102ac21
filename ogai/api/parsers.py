"""The API's JSON parser: DRF's, with the depth limit of `ogai.json_input`, so a body nested
5,000 deep is a 400 `parse_error` in the error envelope, not a RecursionError."""

import codecs

from rest_framework import parsers
from rest_framework.exceptions import ParseError
from rest_framework.utils import json as drf_json

from ogai import json_input


class JSONParser(parsers.JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        encoding = parsers.get_encoding(parser_context or {})
        try:
            text = codecs.getreader(encoding)(stream).read()
            parse_constant = drf_json.strict_constant if self.strict else None
            return json_input.loads(text, parse_constant=parse_constant)
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
