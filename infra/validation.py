"""Pydantic errors as the one line a user sees; free of heavy imports, so the trainer can use it too."""

from collections.abc import Callable

from pydantic import ValidationError


def dotted(location: tuple) -> str:
    return ".".join(str(part) for part in location)


def validation_message(error: ValidationError, with_input: bool = True,
                       where: Callable[[tuple], str] = dotted) -> str:
    """The first problem of a pydantic error as one line: ``field: message (got value)``.

    ``where`` spells the field's location as the user wrote it (a flag, a stack file key).
    """
    first = error.errors()[0]
    location = where(first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    if not location:
        return message
    return f"{location}: {message}" + (f" (got {first['input']!r})" if with_input else "")
