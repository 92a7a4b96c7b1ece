"""The fenced code blocks of README.md and docs/, for the tests that keep the documentation's shell
examples runnable (tests/test_docs.py).

A shell block (```bash, ```sh, ```shell or ```console) either runs offline against the bundled digits
model, or its first line says what it needs that a test machine lacks, visibly to readers:

    # needs: an NVIDIA GPU with TensorRT

A ```console block is a transcript: its commands are the lines after a `$ ` prompt (with `\\`
continuations), the rest is output shown for the reader. Every fence declares a language, so no
shell example hides in an unlabelled block.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

SHELL_LANGUAGES = ("bash", "sh", "shell", "console")
NEEDS = re.compile(r"^#\s*needs:\s*(\S.*)$")
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")


@dataclass(frozen=True)
class Block:
    path: Path  # relative to the repository root
    line: int  # 1-based line of the opening fence
    language: str  # "" when the fence declares none
    text: str

    @property
    def id(self) -> str:
        return f"{self.path.as_posix()}:{self.line}"

    @property
    def is_shell(self) -> bool:
        return self.language in SHELL_LANGUAGES

    @property
    def needs(self) -> Optional[str]:
        """What the block needs that a test machine lacks, from its first non-empty line; None: it runs."""
        for line in self.text.splitlines():
            if line.strip():
                match = NEEDS.match(line.strip())
                return match.group(1).strip() if match else None
        return None

    def script(self) -> str:
        """The commands to run: the block itself, or a console transcript's prompted lines."""
        if self.language != "console":
            return self.text
        commands: List[str] = []
        continuing = False
        for line in self.text.splitlines():
            if continuing or line.startswith("$ "):
                commands.append(line if continuing else line[2:])
                continuing = line.rstrip().endswith("\\")
        return "\n".join(commands) + "\n"


def documentation_files(root: Path) -> List[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def blocks(root: Path) -> List[Block]:
    found: List[Block] = []
    for path in documentation_files(root):
        lines = path.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            match = FENCE.match(lines[i])
            if not match:
                i += 1
                continue
            fence, start = match.group(2), i
            i += 1
            body: List[str] = []
            while i < len(lines) and not lines[i].strip().startswith(fence):
                body.append(lines[i])
                i += 1
            i += 1  # the closing fence
            found.append(Block(path.relative_to(root), start + 1, match.group(3).lower(), "\n".join(body) + "\n"))
    return found
