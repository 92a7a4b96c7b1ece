"""Measure one runner on one input batch: start-up, latency distribution, throughput, memory.

The loop is deliberately thin (one ``runner.run(feeds)`` and one list append per iteration) so the
profiler measures the runtime, not itself; ``bench/bench_profiler_overhead.py`` checks that its p50
stays within 3% of a bare ``session.run`` loop.

Definitions (they are the report's, see ``report.COLUMNS``):

* start-up: from the start of the runner's construction (session or engine load) to the first
  result, i.e. what a service pays before its first answer.
* latency: the host wall time of one ``run`` call (``Runner.last_latency_s``); runners that time
  the device separately (TensorRT: CUDA events around ``execute_async_v3``) expose
  ``last_device_time_s`` and get a second distribution.
* throughput: images per second over the timed loop, ``batch * iterations / sum(latencies)``.
* coefficient of variation (CV): std / mean of the timed latencies; above ``cv_threshold`` the cell
  is flagged unstable (noisy neighbours, frequency scaling, thermal throttling, too few iterations).
* peak RSS: the process's resident-set high-water mark (VmHWM). On Linux it is reset before each
  cell through ``/proc/self/clear_refs`` so the number belongs to that cell; where it cannot be
  reset, it is the process peak so far and ``rss_scope`` says so.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, Sequence

import numpy as np

from ..errors import UsageError, UserError
from ..runtime.base import Runner

DEFAULT_WARMUP = 10
DEFAULT_DURATION_S = 3.0  # when neither an iteration count nor a duration is given (trtexec's default)
MIN_ITERATIONS = 10  # a duration-bound cell still times at least this many calls
DEFAULT_CV_THRESHOLD = 0.10


@dataclass(frozen=True)
class LatencyStats:
    """Summary of one set of timings, in seconds."""

    n: int
    mean_s: float
    std_s: float  # sample standard deviation (ddof=1)
    min_s: float
    max_s: float
    p50_s: float
    p90_s: float
    p99_s: float
    total_s: float

    @property
    def cv(self) -> float:
        """Coefficient of variation, std / mean (0 for a single sample)."""
        return self.std_s / self.mean_s if self.mean_s > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["cv"] = self.cv
        return data


def summarize(samples_s: Sequence[float]) -> LatencyStats:
    """Percentiles (linear interpolation, numpy's default), mean, sample std, min, max."""
    values = np.asarray(samples_s, dtype=np.float64)
    if values.size == 0:
        raise ValueError("no timings to summarise")
    if not np.all(np.isfinite(values)) or np.any(values < 0):
        raise ValueError("timings must be finite and non-negative")
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return LatencyStats(
        n=int(values.size),
        mean_s=float(values.mean()),
        std_s=float(values.std(ddof=1)) if values.size > 1 else 0.0,
        min_s=float(values.min()),
        max_s=float(values.max()),
        p50_s=float(p50),
        p90_s=float(p90),
        p99_s=float(p99),
        total_s=float(values.sum()),
    )


def is_unstable(stats: LatencyStats, cv_threshold: float = DEFAULT_CV_THRESHOLD) -> bool:
    return bool(stats.n > 1 and stats.cv > cv_threshold)


# -- memory ------------------------------------------------------------------------------------
def _status_kb(key: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def current_rss_mb() -> float | None:
    kb = _status_kb("VmRSS")
    return kb / 1024 if kb is not None else None


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0: write 5 to clear_refs). False if not possible."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float:
    """Resident-set high-water mark: VmHWM where /proc exists, else getrusage's ru_maxrss."""
    kb = _status_kb("VmHWM")
    if kb is not None:
        return kb / 1024
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024  # bytes on macOS, KiB elsewhere


class GpuMemoryProbe:
    """Device memory a cell holds, where a GPU is visible.

    Two readings, because one alone was wrong (issue 14: ``gpu_mem_mb`` was 0.0 for every ViT-B cell
    on an H200). The driver's "used" (NVML if installed, else torch's ``mem_get_info``) cannot see
    into torch's caching allocator: the GEMM probe's and earlier cells' freed blocks stay reserved,
    the next torch cell reuses them, and used-after minus used-before is 0. So:

    * before each cell torch's cache is emptied (when torch has initialised CUDA), so the driver
      delta of an ORT or TensorRT cell is what that cell allocated;
    * a torch cell is counted by torch's allocator itself: its peak of allocated bytes during the
      cell minus what was allocated before it (weights, static buffers, CUDA-graph pool,
      activations), which is what the model needs on the device.

    Never imports torch itself: on a CPU-only run the profiler must not pay torch's import and memory.
    """

    def __init__(self) -> None:
        self._nvml = None
        self._handle = None
        try:
            import pynvml  # nvidia-ml-py, optional

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._nvml = pynvml
        except Exception:  # not installed, no driver, no device: all mean "no NVML reading"
            self._nvml = None

    @staticmethod
    def _torch_cuda(initialised: bool = True) -> Any | None:
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        try:
            if not torch.cuda.is_available():
                return None
            return torch.cuda if (torch.cuda.is_initialized() or not initialised) else None
        except Exception:
            return None

    def used_mb(self) -> float | None:
        if self._nvml is not None:
            try:
                return self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used / 2**20
            except Exception:
                return None
        cuda = self._torch_cuda()
        if cuda is not None:
            free, total = cuda.mem_get_info()
            return (total - free) / 2**20
        return None

    def begin(self) -> tuple[float | None, float | None]:
        """Before a cell's runner is built: (driver used MiB, torch allocated MiB), peak reset."""
        cuda = self._torch_cuda()
        if cuda is not None:
            cuda.synchronize()
            cuda.empty_cache()  # earlier cells' cached blocks would hide this cell's allocations
            cuda.reset_peak_memory_stats()
            torch_before: float | None = cuda.memory_allocated() / 2**20
        else:  # torch has not touched the GPU yet (or is not loaded): nothing of its is allocated
            torch_before = 0.0 if self._torch_cuda(initialised=False) is not None else None
        return self.used_mb(), torch_before

    def reset_torch_peak(self) -> None:
        cuda = self._torch_cuda()
        if cuda is not None:
            cuda.reset_peak_memory_stats()

    def torch_peak_mb(self) -> float | None:
        cuda = self._torch_cuda()
        return cuda.max_memory_allocated() / 2**20 if cuda is not None else None

    def cell_mb(self, runner_info: Any, driver_before: float | None, torch_before: float | None,
                driver_after: float | None, torch_peak: float | None) -> float | None:
        """What the cell held: torch's allocator peak delta for a torch runner on CUDA, else the
        driver's used delta."""
        on_cuda = str(getattr(runner_info, "device", "")).startswith("cuda")
        if getattr(runner_info, "backend", None) == "torch" and on_cuda and torch_peak is not None and torch_before is not None:
            return torch_peak - torch_before
        if driver_after is not None and driver_before is not None:
            return driver_after - driver_before
        return None


# -- the measurement ---------------------------------------------------------------------------
@dataclass
class Measurement:
    startup_s: float  # runner construction + first inference
    load_s: float  # runner construction alone
    first_infer_s: float
    warmup: int
    latency: LatencyStats
    device_latency: LatencyStats | None  # CUDA-event time, when the runner provides it
    batch: int
    throughput_ips: float
    cv_threshold: float
    unstable: bool
    peak_rss_mb: float
    rss_before_mb: float | None
    rss_scope: str  # "cell" (peak reset before the cell), "process" (since process start), "sweep" (all cells loaded)
    rss_added_mb: float | None  # what the cell added: peak - before (sequential) or after load - before (interleaved)
    gpu_mem_mb: float | None
    torch_gpu_peak_mb: float | None
    runner: dict[str, Any] = field(default_factory=dict)  # RunnerInfo of the measured runner
    samples_s: list[float] = field(default_factory=list, repr=False)

    def to_dict(self, with_samples: bool = False) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k != "samples_s"}
        data["latency"] = self.latency.to_dict()
        data["device_latency"] = self.device_latency.to_dict() if self.device_latency else None
        if with_samples:
            data["samples_s"] = list(self.samples_s)
        return data


def check_budget(warmup: int, iterations: int | None, duration_s: float | None) -> tuple[int | None, float | None]:
    """Refuse an impossible timing budget; default to DEFAULT_DURATION_S when none is given."""
    if iterations is not None and duration_s is not None:
        raise UsageError("give either an iteration count (--iterations) or a duration (--duration), not both")
    if warmup < 0:
        raise UsageError(f"warm-up must be >= 0 iterations, got {warmup}")
    if iterations is not None and iterations < 1:
        raise UsageError(f"iterations must be >= 1, got {iterations}")
    if duration_s is not None and not duration_s > 0:
        raise UsageError(f"duration must be > 0 seconds, got {duration_s}")
    if iterations is None and duration_s is None:
        duration_s = DEFAULT_DURATION_S
    return iterations, duration_s


Feeds = Dict[str, np.ndarray]  # the runner's named inputs (vitdeploy.runtime.base)


@dataclass
class LoadedRunner:
    """A runner after start-up: loaded, first result timed, warmed up; ready for timed calls."""

    runner: Runner
    feeds: Feeds
    startup_s: float
    load_s: float
    first_infer_s: float
    warmup: int
    rss_before_mb: float | None
    rss_scope: str
    gpu_before_mb: float | None
    gpu_torch_before_mb: float | None = None
    gpu_after_load: tuple[float | None, float | None] = (None, None)  # (driver used, torch peak) after warm-up
    samples: list[float] = field(default_factory=list)
    device: list[float] = field(default_factory=list)


def _as_feeds(runner: Runner, batch: np.ndarray | Feeds) -> Feeds:
    """Named feeds; a bare array is the input of a one-input runner."""
    return dict(batch) if isinstance(batch, dict) else {runner.input_names()[0]: batch}


def load(
    make_runner: Callable[[], Runner],
    batch: np.ndarray | Feeds | Callable[[Runner], np.ndarray | Feeds],
    warmup: int = DEFAULT_WARMUP,
    gpu: GpuMemoryProbe | None = None,
    on_runner: Callable[[Runner], None] | None = None,
    reset_rss: bool = True,
) -> LoadedRunner:
    """Start-up: construct the runner, time its first result, then run the untimed warm-up calls.

    ``batch`` is the input (named feeds, or one array for a one-input runner), or a function of the
    loaded runner that builds it (its input type is only known once the graph is loaded); ``on_runner`` is called with the loaded runner before the
    first inference (e.g. to refuse a shape the graph cannot take). On failure the runner is closed.
    """
    if warmup < 0:
        raise UserError(f"warm-up must be >= 0 iterations, got {warmup}")
    scope = "cell" if reset_rss and reset_peak_rss() else "process"
    rss_before = current_rss_mb()
    gpu_before, torch_before = gpu.begin() if gpu else (None, None)
    t0 = time.perf_counter()
    runner = make_runner()
    t_loaded = time.perf_counter()
    try:
        if on_runner is not None:
            on_runner(runner)
        t_input = time.perf_counter()
        feeds = _as_feeds(runner, batch(runner) if callable(batch) else batch)
        t_input = time.perf_counter() - t_input  # making synthetic input is not part of start-up
        runner.run(feeds)
        t_first = time.perf_counter() - t_input
        for _ in range(warmup):
            runner.run(feeds)
    except BaseException:
        runner.close()
        raise
    loaded = LoadedRunner(runner, feeds, t_first - t0, t_loaded - t0, t_first - t_loaded, warmup, rss_before, scope, gpu_before, torch_before)
    if gpu:
        loaded.gpu_after_load = (gpu.used_mb(), gpu.torch_peak_mb())
    return loaded


def timed_calls(loaded: LoadedRunner, iterations: int | None = None, duration_s: float | None = None,
                min_iterations: int = MIN_ITERATIONS) -> None:
    """Append ``iterations`` timed calls (or as many as fit in ``duration_s``, at least
    ``min_iterations``) to ``loaded.samples``; may be called repeatedly (interleaved sweeps)."""
    runner, feeds = loaded.runner, loaded.feeds
    samples, device = loaded.samples, loaded.device
    has_device = hasattr(runner, "last_device_time_s")
    run = runner.run  # bound once: the loop body stays one call and one append
    if iterations is not None:
        for _ in range(iterations):
            run(feeds)
            samples.append(runner.last_latency_s)
            if has_device:
                device.append(runner.last_device_time_s)  # type: ignore[attr-defined]
        return
    assert duration_s is not None
    count = 0
    deadline = time.perf_counter() + duration_s
    while count < min_iterations or time.perf_counter() < deadline:
        run(feeds)
        samples.append(runner.last_latency_s)
        if has_device:
            device.append(runner.last_device_time_s)  # type: ignore[attr-defined]
        count += 1


def finish(loaded: LoadedRunner, cv_threshold: float = DEFAULT_CV_THRESHOLD, gpu: GpuMemoryProbe | None = None,
           rss_scope: str | None = None, rss_added_mb: float | None = None, gpu_scope: str = "loop") -> Measurement:
    """Summarise the timed calls, read memory, close the runner.

    ``gpu_scope="load"`` takes the device memory read right after the cell's load and warm-up
    (interleaved sweeps: by the end of the loop every cell is resident and the readings mix)."""
    try:
        if gpu is None:
            gpu_after, torch_peak = None, None
        elif gpu_scope == "load":
            gpu_after, torch_peak = loaded.gpu_after_load
        else:
            gpu_after, torch_peak = gpu.used_mb(), gpu.torch_peak_mb()
        info = loaded.runner.info
        gpu_mem = gpu.cell_mb(info, loaded.gpu_before_mb, loaded.gpu_torch_before_mb, gpu_after, torch_peak) if gpu else None
        runner_info = {"backend": info.backend, "precision": info.precision, "device": info.device, **info.details}
    finally:
        loaded.runner.close()
    stats = summarize(loaded.samples)
    device = loaded.device
    n_images = int(len(next(iter(loaded.feeds.values()))))
    peak = peak_rss_mb()
    if rss_added_mb is None and loaded.rss_before_mb is not None:
        rss_added_mb = peak - loaded.rss_before_mb
    return Measurement(
        startup_s=loaded.startup_s,
        load_s=loaded.load_s,
        first_infer_s=loaded.first_infer_s,
        warmup=loaded.warmup,
        latency=stats,
        device_latency=summarize(device) if device and all(math.isfinite(d) for d in device) else None,
        batch=n_images,
        throughput_ips=n_images * stats.n / stats.total_s if stats.total_s > 0 else float("nan"),
        cv_threshold=cv_threshold,
        unstable=is_unstable(stats, cv_threshold),
        peak_rss_mb=peak,
        rss_before_mb=loaded.rss_before_mb,
        rss_scope=rss_scope or loaded.rss_scope,
        rss_added_mb=rss_added_mb,
        gpu_mem_mb=gpu_mem,
        torch_gpu_peak_mb=torch_peak,
        runner=runner_info,
        samples_s=list(loaded.samples),
    )


def measure(
    make_runner: Callable[[], Runner],
    batch: np.ndarray | Feeds | Callable[[Runner], np.ndarray | Feeds],
    warmup: int = DEFAULT_WARMUP,
    iterations: int | None = None,
    duration_s: float | None = None,
    cv_threshold: float = DEFAULT_CV_THRESHOLD,
    min_iterations: int = MIN_ITERATIONS,
    gpu: GpuMemoryProbe | None = None,
    on_runner: Callable[[Runner], None] | None = None,
) -> Measurement:
    """Load a runner, time its first result, warm it up, then time ``iterations`` calls or as many
    as fit in ``duration_s`` (at least ``min_iterations``). The runner is closed before returning.
    See :func:`load` for ``batch`` and ``on_runner``."""
    iterations, duration_s = check_budget(warmup, iterations, duration_s)
    loaded = load(make_runner, batch, warmup, gpu, on_runner)
    try:
        timed_calls(loaded, iterations, duration_s, min_iterations)
    except BaseException:
        loaded.runner.close()
        raise
    return finish(loaded, cv_threshold, gpu)


def cpu_affinity() -> list[int]:
    """CPUs this process may run on (what a thread count is pinned against)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def default_threads() -> int:
    return len(cpu_affinity())
