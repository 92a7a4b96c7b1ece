"""An interrupted command stops what it was running and frees it before the interpreter exits.

Ctrl-C during `convert` printed the right line and then, in about one try in four, aborted at
interpreter exit with "terminate called without an active exception" (exit 134 instead of 130). Two
causes, both fixed: a signal landing inside ``Thread.join(timeout)`` marked the still-running ONNX
Runtime worker stopped (CPython's bpo-45274 branch of ``_wait_for_tstate_lock``), so the command
went on while the run computed (exporters/ort_interrupt.py now waits on an event of its own; see
tests/test_fp16_budget.py); and the exception kept the unwound frames, with the session in them,
alive until module teardown (cli/common.py now clears them and collects). The abort depends on
thread timing; what the fix guarantees does not: the session is gone when the command returns, with
the garbage collector switched off so only the command's own clean-up can have freed it.
"""

from __future__ import annotations

import gc
import signal
import threading
import weakref

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from vitdeploy.cli.common import command


def _long_session():
    """An ORT session on hundreds of chained MatMuls: seconds of work, stopped within one node."""
    import onnxruntime as ort

    n, depth = 256, 400
    w = numpy_helper.from_array(np.eye(n, dtype=np.float32) * 0.5, "w")
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"t{i}", "w"], [f"t{i + 1}"]) for i in range(depth)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])],
                              [helper.make_tensor_value_info(f"t{depth}", TensorProto.FLOAT, [n, n])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def test_an_interrupted_command_frees_its_session_before_it_exits() -> None:
    from vitdeploy.exporters import ort_interrupt

    held: list[weakref.ref] = []
    main = threading.main_thread().ident

    @command("spin")
    def spin() -> None:
        session = _long_session()
        held.append(weakref.ref(session))
        started = threading.Event()
        original = session.run

        def run_and_announce(*args, **kwargs):
            started.set()
            return original(*args, **kwargs)

        session.run = run_and_announce  # type: ignore[method-assign]

        def interrupt() -> None:
            started.wait()
            signal.pthread_kill(main, signal.SIGINT)

        threading.Thread(target=interrupt, daemon=True).start()
        ort_interrupt.run(session, None, {"x": np.ones((256, 256), np.float32)})

    gc.disable()
    try:
        code = spin.main([], standalone_mode=False)
        assert code == 130  # interrupted (SIGINT), reported in one line
        assert held and held[0]() is None, "the interrupted session outlived the command"
    finally:
        gc.enable()
