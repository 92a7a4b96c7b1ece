"""What a command shows on the terminal: one rich Console for every command, wide enough for
vitdeploy's tables when output is piped (rich would otherwise wrap at 80 columns in CI logs and
`| tee`), transient progress bars, and the log (module loggers under "vitdeploy", shown on stderr at
the verbosity of `vitdeploy -v/-q`)."""

from __future__ import annotations

import logging
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


# -- logging: every module logs to logging.getLogger(__name__) under "vitdeploy"; the CLI shows it ----------
LOGGER = "vitdeploy"
QUIET, NORMAL, VERBOSE = -1, 0, 1  # -q: results and errors; default: progress lines; -v: debug detail


class _LineFormatter(logging.Formatter):
    """Progress lines as the commands always printed them (the bare message); debug lines name their
    module, warnings and errors say so (as the CLI's one-line errors do)."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.levelno >= logging.ERROR:
            text = f"error: {text}"
        elif record.levelno >= logging.WARNING:
            text = f"warning: {text}"
        elif record.levelno < logging.INFO:
            text = f"debug: {record.name[len(LOGGER) + 1:] if record.name.startswith(LOGGER + '.') else record.name}: {text}"
        if record.exc_info and record.levelno < logging.INFO:
            text += "\n" + self.formatException(record.exc_info)
        return text


class _StderrHandler(logging.Handler):
    """Writes to the stderr of the moment: rich's live progress bars and Click's test runner replace
    sys.stderr while they run, and a line written there lands above the bar instead of through it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stderr
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # noqa: BLE001 - logging must never take the command down
            self.handleError(record)


def configure_logging(verbosity: int = NORMAL) -> None:
    """Show vitdeploy's log on stderr at ``verbosity`` (QUIET, NORMAL, VERBOSE); called by the CLI once per
    command, so each invocation in one process (tests) starts from its own flags."""
    logger = logging.getLogger(LOGGER)
    handler = next((h for h in logger.handlers if isinstance(h, _StderrHandler)), None)
    if handler is None:
        handler = _StderrHandler()
        handler.setFormatter(_LineFormatter())
        logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if verbosity >= VERBOSE else logging.INFO if verbosity == NORMAL else logging.WARNING)
    logger.propagate = False  # the CLI owns the output; a host application's root handlers would print twice
