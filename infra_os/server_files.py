"""Reading a file of servers to register (CSV with a header row, or JSON: a list of objects)."""

import csv
import io
import json

from django.core.exceptions import ValidationError

from infra_os.services.servers import IMPORT_COLUMNS
from ogai import json_input

MAX_BYTES = 2 * 1024 * 1024
MAX_ROWS = 5000
_TRUE = {"1", "true", "yes", "y", "on"}
_FALSE = {"0", "false", "no", "n", "off"}


def _typed(row: dict, number: int) -> dict:
    unknown = sorted(set(row) - set(IMPORT_COLUMNS))
    if unknown:
        raise ValidationError({"file": f"row {number}: unknown column(s) {', '.join(unknown)}; "
                               f"the columns are {', '.join(IMPORT_COLUMNS)}."})
    # An empty cell is a value not given: the default applies (verify_tls stays on).
    out = {key: value for key, value in row.items()
           if value is not None and not (isinstance(value, str) and not value.strip())}
    for key, value in list(out.items()):
        if key == "expected_gpu_count":
            try:
                out[key] = int(str(value).strip() or 0)
            except ValueError:
                raise ValidationError({"file": f"row {number}: expected_gpu_count is not a "
                                       "whole number."}) from None
            if out[key] < 0:
                raise ValidationError({"file": f"row {number}: expected_gpu_count cannot be "
                                       "negative."})
        elif key == "verify_tls":
            text = str(value).strip().lower()
            if isinstance(value, bool):
                continue
            if text not in _TRUE | _FALSE:
                raise ValidationError({"file": f"row {number}: verify_tls: use true or "
                                       "false."})
            out[key] = text in _TRUE
        elif not isinstance(value, str):
            raise ValidationError({"file": f"row {number}: {key} must be text."})
        else:
            out[key] = value.strip()
    return out


def parse_server_file(content: bytes, *, filename: str = "") -> list[dict]:
    """The rows of a server file, typed. JSON when the name ends in .json or the content
    starts with `[`; CSV otherwise."""
    if len(content) > MAX_BYTES:
        raise ValidationError({"file": f"The file is larger than {MAX_BYTES // 1024 // 1024} MB."})
    try:
        text = content.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ValidationError({"file": "The file is not UTF-8 text."}) from None
    if filename.lower().endswith(".json") or text.lstrip().startswith("["):
        try:
            rows = json_input.loads(text)
        except json.JSONDecodeError as exc:
            raise ValidationError({"file": f"This is not valid JSON: {exc.msg} at line "
                                   f"{exc.lineno}."}) from None
        if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
            raise ValidationError({"file": "A JSON server file is a list of objects."})
    else:
        reader = csv.DictReader(io.StringIO(text))
        if not reader.fieldnames or "name" not in reader.fieldnames:
            raise ValidationError({"file": "A CSV server file starts with a header row naming "
                                   f"its columns: {', '.join(IMPORT_COLUMNS)}."})
        rows = []
        for row in reader:
            if None in row:
                raise ValidationError({"file": f"row {reader.line_num - 1}: more values than "
                                       "columns."})
            rows.append(row)
    if len(rows) > MAX_ROWS:
        raise ValidationError({"file": f"At most {MAX_ROWS} servers per file."})
    return [_typed(row, number) for number, row in enumerate(rows, start=1)]
