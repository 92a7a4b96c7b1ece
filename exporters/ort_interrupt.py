"""An ONNX Runtime run that SIGINT/SIGTERM stop within a second (issue 36).

Python runs a signal handler only between bytecodes of the main thread. While that thread is inside
``InferenceSession.run`` (one batch of a ViT at 518x518 is tens of seconds on a CPU) a Ctrl-C or a
SIGTERM waits for the run to end. So the run goes to a worker thread (ONNX Runtime releases the GIL
while it computes) and the main thread waits on it in short slices, where the handler the CLI
installed (cli/common.py: KeyboardInterrupt / Terminated) fires at once. On that exception the run
is told to stop through ``RunOptions.terminate`` (checked by ONNX Runtime between nodes:
https://onnxruntime.ai/docs/api/python/api_summary.html#runoptions), joined, and the exception goes
on up: nothing the command was writing has landed yet (it writes after its gates).
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

WAIT_SLICE_S = 0.05  # how often the waiting main thread lets a pending signal handler run


def run(session: Any, names: Sequence[str] | None, feeds: dict[str, Any]) -> list[Any]:
    """``session.run(names, feeds)``, stoppable by a signal while it computes (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return session.run(names, feeds)  # signals are delivered to the main thread only
    import onnxruntime as ort

    options = ort.RunOptions()
    result: dict[str, Any] = {}

    def work() -> None:
        try:
            result["out"] = session.run(names, feeds, options)
        except BaseException as exc:  # handed to the waiting thread, raised there
            result["error"] = exc

    worker = threading.Thread(target=work, name="ort-run", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(WAIT_SLICE_S)
    except BaseException:
        options.terminate = True  # ONNX Runtime returns at its next node
        worker.join()
        raise
    if "error" in result:
        raise result["error"]
    return result["out"]
