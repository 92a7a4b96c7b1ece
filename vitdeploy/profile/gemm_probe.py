"""How fast can this machine multiply matrices right now? A short GEMM probe run in the same process
as the sweep, so "share of peak" compares a cell with what the same cores (same clocks, same
neighbours, same thread count) deliver on the operation a ViT is made of.

Each probe multiplies two n x n matrices repeatedly for a short time budget and keeps the best
run: 2 n^3 FLOPs / best seconds. Probes on the CPU: numpy's BLAS (threads limited with threadpoolctl
when it is installed), ONNX Runtime's own MatMul kernel (MLAS, what the ort backend runs) and torch
(only when torch is already loaded, i.e. when the torch backend is in the sweep). On a GPU: torch
fp32 and fp16 matmuls. The machine's peak for a device and precision class is the best probe; the
probes themselves go into the report so the number can be checked.

This is a measured ceiling for dense GEMM, not a datasheet peak: attention softmax, LayerNorm and
GELU are memory-bound and a whole network never reaches it.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

from .. import precisions
from ..lazy import available

CPU_SIZE = 1024
GPU_SIZE = 8192
BUDGET_S = 0.3


@dataclass(frozen=True)
class PeakProbe:
    device: str  # "cpu" or "cuda:0"
    dtype: str  # "fp32" or "fp16"
    library: str  # "numpy/openblas", "onnxruntime", "torch", ...
    n: int
    threads: int | None  # None: the library's own choice (GPU)
    runs: int
    best_s: float
    gflops: float  # 2 n^3 / best_s / 1e9

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _best_time(step: Callable[[], Any], budget_s: float, sync: Callable[[], None] | None = None) -> tuple[float, int]:
    step()  # first call allocates / picks kernels
    if sync:
        sync()
    best, runs = float("inf"), 0
    deadline = time.perf_counter() + budget_s
    while runs < 3 or time.perf_counter() < deadline:
        start = time.perf_counter()
        step()
        if sync:
            sync()
        best = min(best, time.perf_counter() - start)
        runs += 1
    return best, runs


def _probe(device: str, dtype: str, library: str, n: int, threads: int | None, step: Callable[[], Any],
           budget_s: float, sync: Callable[[], None] | None = None) -> PeakProbe:
    best, runs = _best_time(step, budget_s, sync)
    return PeakProbe(device, dtype, library, n, threads, runs, best, 2 * n**3 / best / 1e9)


def probe_numpy(threads: int, n: int = CPU_SIZE, budget_s: float = BUDGET_S) -> PeakProbe:
    rng = np.random.default_rng(0)
    a = rng.random((n, n), dtype=np.float32)
    b = rng.random((n, n), dtype=np.float32)
    library = "numpy"
    if available("threadpoolctl"):
        from threadpoolctl import threadpool_info, threadpool_limits

        apis = sorted({info.get("internal_api", "blas") for info in threadpool_info() if info.get("user_api") == "blas"})
        library = "numpy/" + ("+".join(apis) or "blas")
        with threadpool_limits(limits=threads, user_api="blas"):
            return _probe("cpu", "fp32", library, n, threads, lambda: a @ b, budget_s)
    # Without threadpoolctl the BLAS picks its own thread count; say so instead of pretending.
    return _probe("cpu", "fp32", library + " (threads unpinned)", n, None, lambda: a @ b, budget_s)


def probe_onnxruntime(threads: int, n: int = CPU_SIZE, budget_s: float = BUDGET_S) -> PeakProbe:
    """A one-node MatMul graph on ORT's CPU provider with the sweep's intra-op thread count."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["A", "B"], ["C"])],
        "gemm_probe",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [n, n]), helper.make_tensor_value_info("B", TensorProto.FLOAT, [n, n])],
        [helper.make_tensor_value_info("C", TensorProto.FLOAT, [n, n])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = min(model.ir_version, onnx.IR_VERSION, 9)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), sess_options=opts, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feed = {"A": rng.random((n, n), dtype=np.float32), "B": rng.random((n, n), dtype=np.float32)}
    return _probe("cpu", "fp32", f"onnxruntime {ort.__version__} (MLAS)", n, threads, lambda: session.run(None, feed), budget_s)


def probe_torch_cpu(threads: int, n: int = CPU_SIZE, budget_s: float = BUDGET_S) -> PeakProbe:
    torch = sys.modules["torch"]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.rand(n, n), torch.rand(n, n)
        with torch.no_grad():
            return _probe("cpu", "fp32", f"torch {torch.__version__}", n, threads, lambda: a @ b, budget_s)
    finally:
        torch.set_num_threads(before)


def probe_torch_cuda(dtype: str, n: int = GPU_SIZE, budget_s: float = BUDGET_S) -> PeakProbe:
    torch = sys.modules["torch"]
    tdtype = torch.float16 if dtype == "fp16" else torch.float32
    a = torch.rand(n, n, device="cuda", dtype=tdtype)
    b = torch.rand(n, n, device="cuda", dtype=tdtype)
    name = torch.cuda.get_device_name(0)
    with torch.no_grad():
        return _probe("cuda:0", dtype, f"torch {torch.__version__} ({name})", n, None, lambda: a @ b, budget_s, torch.cuda.synchronize)


def measure_peaks(threads: int, backends: set[str], cuda: bool, budget_s: float = BUDGET_S) -> list[PeakProbe]:
    """Run the probes that matter for this sweep. torch is used only if the sweep already loaded it."""
    probes = [probe_numpy(threads, budget_s=budget_s)]
    if "ort" in backends and available("onnxruntime"):
        probes.append(probe_onnxruntime(threads, budget_s=budget_s))
    torch_loaded = "torch" in sys.modules
    if torch_loaded and "torch" in backends:
        probes.append(probe_torch_cpu(threads, budget_s=budget_s))
    if cuda and torch_loaded and sys.modules["torch"].cuda.is_available():
        probes.append(probe_torch_cuda("fp32", budget_s=budget_s))
        probes.append(probe_torch_cuda("fp16", budget_s=budget_s))
    return probes


def peak_for(probes: list[PeakProbe], device: str, precision: str) -> PeakProbe | None:
    """The ceiling a cell is compared with: the best probe on the cell's device for its precision
    class. On a GPU, fp16 and int8 cells compare with the fp16 probe (tensor cores) and fp32 with
    fp32; on the CPU every precision compares with fp32 (the integer kernels are counted against
    the float ceiling, which is what a user buying speed from int8 wants to know)."""
    is_gpu = device.startswith("cuda")
    want = precisions.get(precisions.computes_in(precision)).gpu_peak_dtype if is_gpu else "fp32"
    kind = "cuda" if is_gpu else "cpu"
    matching = [p for p in probes if p.device.startswith(kind) and p.dtype == want]
    return max(matching, key=lambda p: p.gflops) if matching else None
