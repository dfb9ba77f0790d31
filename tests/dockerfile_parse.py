"""Just enough of the Dockerfile format to test what the images run: the instructions
after continuation joining, ARG defaults, ENV, COPY destinations and ENTRYPOINT/CMD."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
IMAGES = REPO / "images"
_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


@dataclass(frozen=True)
class Dockerfile:
    path: Path
    instructions: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, image: str) -> Dockerfile:
        path = IMAGES / image / "Dockerfile"
        return cls(path, tuple(_instructions(path.read_text())))

    def all(self, keyword: str) -> list[str]:
        return [rest for key, rest in self.instructions if key == keyword]

    def arg_defaults(self) -> dict[str, str]:
        return dict(arg.split("=", 1) for arg in self.all("ARG") if "=" in arg)

    def expand(self, text: str) -> str:
        """``text`` with every ARG default substituted, defaults that name other ARGs included."""
        defaults = self.arg_defaults()
        while _VARIABLE.search(text):
            text = _VARIABLE.sub(lambda m: defaults[m[1] or m[2]], text)
        return text

    def env(self) -> dict[str, str]:
        pairs = [pair for rest in self.all("ENV") for pair in shlex.split(rest)]
        return dict(pair.split("=", 1) for pair in pairs)

    def copies(self) -> dict[str, str]:
        """Image path -> repository path of every COPY from the build context."""
        out = {}
        for rest in self.all("COPY"):
            if "--from=" in rest:  # from another build stage, not the context
                continue
            words = [w for w in shlex.split(rest) if not w.startswith("--")]
            out[words[-1]] = words[0]
        return out

    def exec_form(self, keyword: str) -> list[str]:
        """The last ENTRYPOINT or CMD, which must be in exec (JSON) form; [] when absent."""
        found = self.all(keyword)
        return json.loads(found[-1]) if found else []

    def command(self) -> list[str]:
        return self.exec_form("ENTRYPOINT") + self.exec_form("CMD")

    def local_command(self) -> list[str]:
        """``command()`` with files the image COPYs from this repository run from here."""
        copies = self.copies()
        return [str(REPO / copies[word]) if word in copies else word for word in self.command()]

    def base_image(self) -> str:
        return self.expand(self.all("FROM")[-1].split()[0])


def _instructions(text: str):
    logical = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        logical += line.rstrip()
        if logical.endswith("\\"):
            logical = logical[:-1] + " "
            continue
        keyword, _, rest = logical.strip().partition(" ")
        yield keyword.upper(), " ".join(rest.split()) if keyword.upper() in ("RUN", "LABEL") else rest.strip()
        logical = ""


def dockerfiles() -> list[str]:
    return sorted(p.parent.name for p in IMAGES.glob("*/Dockerfile"))
