"""Pydantic errors as the one line a user sees; free of heavy imports, so the trainer can use it too."""

from pydantic import ValidationError


def validation_message(error: ValidationError, with_input: bool = True) -> str:
    """The first problem of a pydantic error as one line: ``field: message (got value)``."""
    first = error.errors()[0]
    location = ".".join(str(part) for part in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    if not location:
        return message
    return f"{location}: {message}" + (f" (got {first['input']!r})" if with_input else "")
