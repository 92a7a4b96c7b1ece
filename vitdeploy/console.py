"""One rich Console for every command: wide enough for vitdeploy's tables when output is piped
(rich would otherwise wrap at 80 columns in CI logs and `| tee`)."""

from __future__ import annotations

import os
import shutil
import sys


def get_console(stderr: bool = False):
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else int(os.environ.get("COLUMNS", 0)) or max(shutil.get_terminal_size((160, 24)).columns, 160)
    return Console(file=stream, width=width, soft_wrap=False)
