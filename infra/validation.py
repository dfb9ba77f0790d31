"""Pydantic errors as the one line a user sees; free of heavy imports, so the trainer can use it too."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

MAX_SHOWN = 60  # characters of a value quoted back in a message


def one_line(text: object) -> str:
    """``text`` with every run of whitespace (newlines too, as botocore and YAML errors have them) as one space."""
    return " ".join(str(text).split())


def dotted(location: tuple) -> str:
    return ".".join(str(part) for part in location)


def as_typed(value: Any) -> str:
    """A value as a user writes it in YAML or JSON (``true``, ``null``, ``"8"``, ``.nan``), shortened."""
    if isinstance(value, float) and not math.isfinite(value):
        text = str(value)
    else:
        try:
            text = json.dumps(value, ensure_ascii=False, default=str)
        except ValueError:  # a structure that refers to itself
            text = "..."
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."


def validation_message(error: ValidationError, with_input: bool = True, where: Callable[[tuple], str] = dotted,
                       rules: Mapping[str, str] | None = None, shown: Callable[[Any], str] = repr) -> str:
    """The first problem of a pydantic error as one line: ``field: message (got value)``.

    ``where`` spells the field's location as the user wrote it (a flag, a stack file key); ``rules`` says in words
    what a regular expression a value failed demands; ``shown`` spells the value.
    """
    first = error.errors()[0]
    location = where(first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    pattern = (first.get("ctx") or {}).get("pattern")
    if first["type"] == "string_pattern_mismatch" and rules and pattern in rules:
        message = f"must be {rules[pattern]}"
    if first["type"] == "extra_forbidden":
        message = "unknown key"
    value = first["input"]
    got = (with_input and first["type"] != "extra_forbidden" and not isinstance(value, (dict, list, tuple))
           and str(value) not in message)
    if not location:
        return one_line(message)
    return one_line(f"{location}: {message}" + (f" (got {shown(value)})" if got else ""))
