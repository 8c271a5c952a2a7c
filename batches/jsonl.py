"""A JSONL file read line by line: where each line lies in the file and the JSON object it holds.

Both the upload check (batches/files.py) and a batch's creation (batches/batch_create.py) read files through here, so
a line number means the same everywhere: 1-based, counting every line of the file, blank ones included (the number
an editor shows). A line ends at "\\n" only; a "\\r" before it is not part of the line. Blank lines are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO


@dataclass(frozen=True, slots=True)
class Line:
    """One non-blank line: its number, the byte offset of its first byte, its length without the line end, and
    its bytes."""

    number: int
    offset: int
    length: int
    raw: bytes


def read_lines(stream: BinaryIO) -> Iterator[tuple[bytes, Line | None]]:
    """Each line of `stream` as it was read (with its line end, to copy) and its `Line` (None for a blank one)."""
    offset = 0
    for number, chunk in enumerate(stream, start=1):
        body = chunk[:-1] if chunk.endswith(b"\n") else chunk
        body = body[:-1] if body.endswith(b"\r") else body
        yield chunk, (Line(number, offset, len(body), body) if body.strip() else None)
        offset += len(chunk)


def lines(stream: BinaryIO) -> Iterator[Line]:
    """The non-blank lines of `stream`."""
    for _, line in read_lines(stream):
        if line is not None:
            yield line


class NotAnObject(ValueError):
    """A line that is not one JSON object; the message says why."""


def _no_constants(name: str) -> Any:
    raise NotAnObject(f"{name} is not JSON")


_JSON_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


def parse_object(raw: bytes) -> dict[str, Any]:
    """The JSON object a line holds; raises NotAnObject when it is not UTF-8, not JSON (NaN and Infinity are not),
    nested past the parser's depth, or a JSON value other than an object."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotAnObject(f"not UTF-8 (byte {exc.start + 1})") from None
    try:
        value = json.loads(text, parse_constant=_no_constants)
    except json.JSONDecodeError as exc:
        raise NotAnObject(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise NotAnObject("nested too deeply") from None
    if not isinstance(value, dict):
        raise NotAnObject(f"a JSON {_JSON_KINDS.get(type(value), 'value')}, not an object")
    return value
