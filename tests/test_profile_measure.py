"""Profile statistics and the measurement loop on synthetic timings (no model, no onnxruntime)."""

from __future__ import annotations

import numpy as np
import pytest

from vitdeploy.errors import UserError
from vitdeploy.profile.gemm_probe import PeakProbe, peak_for, probe_numpy
from vitdeploy.profile.measure import (
    current_rss_mb,
    is_unstable,
    measure,
    peak_rss_mb,
    summarize,
)
from vitdeploy.runtime.base import Runner, RunnerInfo, TensorInfo


def test_summarize_known_distribution():
    # 1..100 ms: numpy's linear percentiles are exact here and easy to check by hand.
    samples = [i / 1000 for i in range(1, 101)]
    s = summarize(samples)
    assert s.n == 100
    assert s.min_s == pytest.approx(0.001) and s.max_s == pytest.approx(0.100)
    assert s.p50_s == pytest.approx(0.0505)
    assert s.p90_s == pytest.approx(0.0901)
    assert s.p99_s == pytest.approx(0.09901)
    assert s.mean_s == pytest.approx(0.0505)
    assert s.std_s == pytest.approx(np.std(np.arange(1, 101) / 1000, ddof=1))
    assert s.total_s == pytest.approx(5.05)
    assert s.cv == pytest.approx(s.std_s / s.mean_s)


def test_summarize_single_sample_and_bad_input():
    s = summarize([0.02])
    assert s.std_s == 0.0 and s.p50_s == s.p99_s == 0.02 and s.cv == 0.0
    with pytest.raises(ValueError):
        summarize([])
    with pytest.raises(ValueError):
        summarize([0.01, float("nan")])
    with pytest.raises(ValueError):
        summarize([0.01, -0.01])


def test_cv_flags_unstable_cells():
    steady = summarize([0.010, 0.0101, 0.0099, 0.0100, 0.0102])
    noisy = summarize([0.010, 0.030, 0.010, 0.011, 0.050])
    assert not is_unstable(steady, 0.10)
    assert noisy.cv > 0.5 and is_unstable(noisy, 0.10)
    assert not is_unstable(noisy, 10.0)  # the threshold is the caller's


class ScriptedRunner(Runner):
    """A runner whose call latencies are a fixed script, so the statistics are known exactly."""

    def __init__(self, latencies: list[float]):
        self.latencies = list(latencies)
        self.calls = 0
        self.closed = False
        self.info = RunnerInfo(backend="scripted", precision="fp32", device="cpu", details={"threads": 1})

    def inputs(self) -> list[TensorInfo]:
        return [TensorInfo("images", "uint8", ("batch", 8, 8, 3))]

    def outputs(self) -> list[str]:
        return ["logits"]

    def _run(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        return {"logits": np.zeros((batch.shape[0], 2), np.float32)}

    def run(self, feeds, outputs=None) -> dict[str, np.ndarray]:
        out = self._run(feeds["images"])
        self.last_latency_s = self.latencies[self.calls % len(self.latencies)]
        self.calls += 1
        return out

    def close(self) -> None:
        self.closed = True


def test_measure_counts_warmup_separately_and_closes_the_runner():
    # first call 1 s (excluded: it is start-up), 3 warm-up calls, then 5 timed calls of 10..50 ms
    script = [1.0, 0.5, 0.5, 0.5, 0.01, 0.02, 0.03, 0.04, 0.05]
    made: list[ScriptedRunner] = []

    def make() -> ScriptedRunner:
        made.append(ScriptedRunner(script))
        return made[-1]

    batch = np.zeros((4, 8, 8, 3), np.uint8)
    m = measure(make, batch, warmup=3, iterations=5, cv_threshold=0.1)
    runner = made[0]
    assert runner.calls == 1 + 3 + 5 and runner.closed
    assert m.latency.n == 5 and m.warmup == 3
    assert m.latency.p50_s == pytest.approx(0.03)
    assert m.latency.min_s == pytest.approx(0.01) and m.latency.max_s == pytest.approx(0.05)
    assert m.throughput_ips == pytest.approx(4 * 5 / 0.15)  # batch x iterations / total time
    assert m.unstable  # 10..50 ms has a CV of ~53%
    assert m.startup_s >= m.load_s >= 0
    assert m.runner["backend"] == "scripted" and m.runner["threads"] == 1
    assert m.peak_rss_mb > 0 and m.rss_scope in ("cell", "process")


def test_measure_builds_the_batch_from_the_loaded_runner_and_honours_duration():
    seen = {}

    def make_batch(runner: Runner) -> np.ndarray:
        seen["input"] = runner.inputs()[0]
        return np.zeros((2, 8, 8, 3), np.uint8)

    m = measure(lambda: ScriptedRunner([0.001]), make_batch, warmup=0, duration_s=0.05, min_iterations=7)
    assert seen["input"].dtype == "uint8"
    assert m.latency.n >= 7 and m.batch == 2


def test_measure_rejects_bad_budgets():
    batch = np.zeros((1, 8, 8, 3), np.uint8)
    with pytest.raises(UserError, match="not both"):
        measure(lambda: ScriptedRunner([0.01]), batch, iterations=5, duration_s=1.0)
    with pytest.raises(UserError, match="iterations"):
        measure(lambda: ScriptedRunner([0.01]), batch, iterations=0)
    with pytest.raises(UserError, match="warm-up"):
        measure(lambda: ScriptedRunner([0.01]), batch, warmup=-1, iterations=3)


def test_memory_readings_are_plausible():
    rss = current_rss_mb()
    peak = peak_rss_mb()
    assert peak > 1  # a Python process with numpy loaded holds well over 1 MiB
    if rss is not None:
        assert peak >= rss * 0.99


def test_gemm_probe_and_peak_selection():
    probe = probe_numpy(threads=1, n=128, budget_s=0.02)
    assert probe.gflops > 0 and probe.runs >= 3 and probe.device == "cpu"
    assert probe.gflops == pytest.approx(2 * 128**3 / probe.best_s / 1e9)
    gpu32 = PeakProbe("cuda:0", "fp32", "torch", 8192, None, 3, 0.1, 50_000)
    gpu16 = PeakProbe("cuda:0", "fp16", "torch", 8192, None, 3, 0.01, 400_000)
    cpu_b = PeakProbe("cpu", "fp32", "onnxruntime", 1024, 2, 3, 0.01, probe.gflops * 10)
    probes = [probe, cpu_b, gpu32, gpu16]
    assert peak_for(probes, "cpu", "int8") is cpu_b  # best CPU probe, float ceiling for every precision
    assert peak_for(probes, "cuda:0", "fp32") is gpu32
    assert peak_for(probes, "cuda:0", "int8") is gpu16  # tensor-core class on a GPU
    assert peak_for([probe], "cuda:0", "fp16") is None
