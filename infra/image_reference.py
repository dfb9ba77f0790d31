"""Container image references (``[registry[:port]/]path[:tag][@digest]``), read as containerd and the kubelet read them.

The grammar is distribution/reference's (github.com/distribution/reference, ``regexp.go`` at 00a09fa, ``reference.go``:
name, tag and digest patterns, a repository path of at most 255 characters); digests are those go-digest registers
(opencontainers/go-digest ``algorithm.go``: sha256, sha384, sha512, hex of their length). Anything else is refused
where the user typed it, not by the kubelet as ``InvalidImageName`` once the job is scheduled.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

_ALPHANUMERIC = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
_PATH_COMPONENT = rf"{_ALPHANUMERIC}(?:{_SEPARATOR}{_ALPHANUMERIC})*"
_REMOTE_NAME = rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"\w[\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
REFERENCE = re.compile(rf"(?:({_HOST}(?::[0-9]+)?)/)?({_REMOTE_NAME})(?::({_TAG}))?(?:@({_DIGEST}))?", re.ASCII)
MAX_PATH = 255
DIGEST_HEX = {"sha256": 64, "sha384": 96, "sha512": 128}
EXAMPLE = "registry.example.com/team/trainer:1.2"


def check_image_reference(text: str) -> str:
    """``text`` if it is an image reference; a ValueError saying what is wrong with it otherwise."""
    match = REFERENCE.fullmatch(text)
    if match is None:
        hint = "; repositories are lower-case" if REFERENCE.fullmatch(text.lower()) else ""
        raise ValueError(f"{text!r} is not an image reference (like {EXAMPLE}){hint}")
    _, path, _, digest = match.groups()
    if len(path) > MAX_PATH:
        raise ValueError(f"{text!r}: the repository path has {len(path)} characters, at most {MAX_PATH}")
    if digest:
        algorithm, _, value = digest.partition(":")
        if DIGEST_HEX.get(algorithm) != len(value) or value != value.lower():
            raise ValueError(f"{text!r}: a digest is sha256:<64 lower-case hex digits> (or sha384, sha512)")
    return text


ImageReference = Annotated[str, AfterValidator(check_image_reference)]
