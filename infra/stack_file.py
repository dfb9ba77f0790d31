"""Reading a ``Pulumi.<stack>.yaml`` strictly: one YAML mapping, no duplicate keys, known namespaces.

Pulumi itself keeps the last of two equal keys and ignores config of a namespace nobody reads, so a
mistyped key would silently change nothing; here both are errors naming the key as written.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import yaml

# Namespaces a stack file may configure: ours and the providers the program uses.
NAMESPACES = ("gpuyard", "aws", "kubernetes", "pulumi")
REQUIRED_KEYS = ("aws:region", "gpuyard:cluster_name", "gpuyard:teams")


class StackFileError(ValueError):
    """A stack file that is not a stack file, as one line."""


class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping holding the same key twice."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (line {key_node.start_mark.line + 1})", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _suggest(word: str, choices: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def read_config(path: Path) -> dict[str, Any]:
    """The ``config:`` mapping of a stack file, checked for shape, namespaces and required keys."""
    try:
        document = yaml.load(path.read_bytes().decode("utf-8"), Loader=UniqueKeyLoader)
    except UnicodeDecodeError as error:
        raise StackFileError(f"{path}: not UTF-8 text (byte {error.start})") from None
    except yaml.YAMLError as error:
        raise StackFileError(f"{path}: not valid YAML ({' '.join(str(error).split())})") from None
    if not isinstance(document, dict):
        raise StackFileError(f"{path}: expected a mapping with a 'config:' key, got {type(document).__name__}")
    unknown = sorted(set(document) - {"config", "secretsprovider", "encryptedkey", "encryptionsalt", "environment"})
    if unknown:
        raise StackFileError(f"{path}: unknown top-level key {unknown[0]!r} (stack settings go under 'config:')")
    config = document.get("config")
    if not isinstance(config, dict):
        raise StackFileError(f"{path}: 'config:' must be a mapping of namespace:key settings")
    for key in config:
        namespace, colon, _ = str(key).partition(":")
        if not colon:
            raise StackFileError(f"{path}: config key {key!r} has no namespace (write gpuyard:{key})")
        if namespace not in NAMESPACES:
            raise StackFileError(f"{path}: unknown namespace in {key!r}{_suggest(namespace, NAMESPACES)}")
    missing = [key for key in REQUIRED_KEYS if key not in config]
    if missing:
        raise StackFileError(f"{path}: missing {missing[0]}")
    return config
