"""Run the vitdeploy CLI and stop, for good, at the first rename of a hidden (staged or temporary) file
under the folder ``KILL_POINT_UNDER`` names: print ``READY`` and wait to be killed. tests/test_stale_staging.py kills it there with SIGKILL, the one
signal no clean-up runs for, so what a killed command leaves is known exactly - an event, not a sleep.

    KILL_POINT_UNDER=BUNDLE python tests/kill_point.py convert BUNDLE --precision fp16
"""

from __future__ import annotations

import os
import signal
import sys

_replace = os.replace


def _stop_at_first_staged_rename(src, dst, *args, **kwargs):
    path = os.path.abspath(os.fsdecode(src))
    if os.path.basename(path).startswith(".") and path.startswith(os.path.abspath(os.environ["KILL_POINT_UNDER"]) + os.sep):
        sys.stdout.write("READY\n")
        sys.stdout.flush()
        while True:
            signal.pause()
    return _replace(src, dst, *args, **kwargs)


if __name__ == "__main__":
    os.replace = _stop_at_first_staged_rename
    from vitdeploy.cli import main

    main(sys.argv[1:], prog_name="vitdeploy")
