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


def lazy_progress(console, *columns):
    """A transient rich Progress that starts with its first task rather than on ``with``: a command refused
    before it does any work prints its one error line, not the bar's blank line before it."""
    from rich.progress import Progress

    class LazyProgress(Progress):
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            if self.live.is_started:
                self.stop()

        def add_task(self, *args, **kwargs):
            if not self.live.is_started:
                self.start()
            return super().add_task(*args, **kwargs)

    return LazyProgress(*columns, console=console, transient=True)
