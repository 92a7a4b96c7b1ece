"""An ONNX Runtime run that SIGINT/SIGTERM stop within a second (issue 36).

Python runs a signal handler only between bytecodes of the main thread. While that thread is inside
``InferenceSession.run`` (one batch of a ViT at 518x518 is tens of seconds on a CPU) a Ctrl-C or a
SIGTERM waits for the run to end. So the run goes to a worker thread (ONNX Runtime releases the GIL
while it computes) and the main thread waits on it in short slices, where the handler the CLI
installed (cli/common.py: KeyboardInterrupt / Terminated) fires at once. On that exception the run
is told to stop through ``RunOptions.terminate`` (checked by ONNX Runtime between nodes:
https://onnxruntime.ai/docs/api/python/api_summary.html#runoptions), waited for, and the exception goes
on up: nothing the command was writing has landed yet (it writes after its gates).
"""

from __future__ import annotations

import signal
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
    # The worker says it is done through an event of ours, not Thread.join: a KeyboardInterrupt that
    # lands inside join(timeout) makes CPython (3.8-3.12, threading.Thread._wait_for_tstate_lock, the
    # bpo-45274 branch) release the tstate lock the *worker* holds and mark it stopped, so every later
    # join() returns at once while ONNX Runtime still computes. The run's error then landed after we
    # had dropped our references, kept the session alive, and the process aborted at interpreter exit
    # ("terminate called without an active exception", exit 134 after the right line).
    done = threading.Event()

    def work() -> None:
        try:
            result["out"] = session.run(names, feeds, options)
        except BaseException as exc:  # handed to the waiting thread, raised there
            result["error"] = exc
        finally:
            done.set()

    worker = threading.Thread(target=work, name="ort-run", daemon=True)
    try:
        # held while the thread starts: an interrupt then lands once it has (so it is waited for below)
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            worker.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        while not done.wait(WAIT_SLICE_S):
            pass
    except BaseException:
        options.terminate = True  # ONNX Runtime returns at its next node
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:  # a second Ctrl-C waits until the run has returned, then lands
            if worker.ident is not None:
                done.wait()
                worker.join()  # signals blocked: nothing can cut this join short
            result.clear()  # the run's own error ("terminate flag") and the worker's frame with it
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        raise
    if "error" in result:
        raise result.pop("error")
    return result.pop("out")


def release(exc: BaseException) -> BaseException:
    """``exc`` without the traceback of the interrupted run, after a collection, to be raised by the
    caller that dropped its session. An ONNX Runtime session still alive at interpreter exit after
    a terminated run aborts the process there ("terminate called without an active exception", exit
    134, measured on 1.32): the frames of the run hold it, and a reference cycle the collector alone
    frees (seen: exit 130 only after gc.collect())."""
    import gc

    exc = exc.with_traceback(None)
    gc.collect()
    return exc
