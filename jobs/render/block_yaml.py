"""Block-style YAML for manifests (dicts, lists, str, int, bool, None), fast and stable.

PyYAML's representer is most of the time spent rendering (it resolves every scalar
twice through regexes); manifests only hold JSON-like values, so this writes them
directly, in PyYAML's layout (indentless lists, keys in insertion order). A string is
plain when PyYAML would read it back as the same string, single-quoted when it is
printable ASCII, double-quoted with escapes otherwise. ``yaml.safe_load(dump(x)) == x``.
"""

from __future__ import annotations

import re
from functools import lru_cache

from yaml import SafeLoader
from yaml.nodes import ScalarNode

_STR_TAG = "tag:yaml.org,2002:str"
_RESOLVER = SafeLoader("")
# Printable ASCII that cannot start an indicator, comment or key, nor end a key.
_PLAIN = re.compile(r"(?:[A-Za-z0-9_./~$()^]|-(?=\S))[\x20-\x7e]*")
_NOT_PLAIN = re.compile(r": |:$| #|\s$|^---|^\.\.\.")


@lru_cache(maxsize=8192)
def scalar(text: str) -> str:
    """``text`` as a YAML scalar that loads back as exactly ``text``."""
    if _PLAIN.fullmatch(text) and not _NOT_PLAIN.search(text) and _reads_as_str(text):
        return text
    if all(" " <= char <= "~" for char in text):
        return "'" + text.replace("'", "''") + "'"
    return _double_quoted(text)


def _reads_as_str(text: str) -> bool:
    return _RESOLVER.resolve(ScalarNode, text, (True, False)) == _STR_TAG


def _double_quoted(text: str) -> str:
    out = []
    for char in text:
        code = ord(char)
        if char in '"\\':
            out.append("\\" + char)
        elif 0x20 <= code <= 0x7E:
            out.append(char)
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


def _inline(value) -> str:
    """A value on its key's line: a scalar or an empty collection."""
    if isinstance(value, str):
        return scalar(value)
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if value is None:
        return "null"
    if value == {} or value == []:
        return "{}" if isinstance(value, dict) else "[]"
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as manifest YAML")


def _nested(value) -> bool:
    return isinstance(value, (dict, list)) and bool(value)


def _block(value, pad: str, out: list[str]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"manifest keys are strings, got {key!r}")
            if _nested(item):
                out.append(f"{pad}{scalar(key)}:")
                _block(item, pad if isinstance(item, list) else pad + "  ", out)
            else:
                out.append(f"{pad}{scalar(key)}: {_inline(item)}")
        return
    for item in value:
        if _nested(item):
            first = len(out)
            _block(item, pad + "  ", out)
            out[first] = f"{pad}- {out[first][len(pad) + 2:]}"
        else:
            out.append(f"{pad}- {_inline(item)}")


def dump(document: dict | list) -> str:
    """One YAML document (no ``---``), ending in a newline."""
    if not _nested(document):
        return _inline(document) + "\n"
    out: list[str] = []
    _block(document, "", out)
    return "\n".join(out) + "\n"
