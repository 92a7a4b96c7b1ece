"""The profile's PyTorch baseline (exporters/torch_fast.py, `profile --torch-mode`) on the CPU torch path.

On a GPU host the same comparison (cuda-graph / eager cells against bare loops) is run by
bench/bench_torch_gpu.py through scripts/gpu_check.sh; here the eager cell is held to 1.2x of a
bare PyTorch loop timed in the same test, and every mode's outputs to the reference runner's.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from vitdeploy.cli import main

torch = pytest.importorskip("torch")


def _pixels(n: int, size: int = 32, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, size, size, 3), dtype=np.uint8)


def test_fast_runner_matches_the_reference_runner(digits_bundle):
    from vitdeploy.exporters.torch_fast import FastTorchRunner
    from vitdeploy.exporters.torch_runner import TorchRunner

    batch = _pixels(16)
    with FastTorchRunner.from_bundle(digits_bundle, mode="eager", threads=1) as fast, TorchRunner.from_bundle(digits_bundle, threads=1) as ref:
        got, want = fast.infer(batch), ref.infer(batch)
        assert fast.info.details["torch_mode"] == "eager" and fast.info.details["torch_mode_requested"] == "eager"
        assert not hasattr(fast, "last_device_time_s")  # CPU: no CUDA events, so no device column
        again = fast.infer(batch[:3])  # a second shape gets its own buffers
    np.testing.assert_allclose(got["logits"], want["logits"], atol=1e-4, rtol=0)
    np.testing.assert_allclose(got["probs"], want["probs"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(again["logits"], want["logits"][:3], atol=1e-4, rtol=0)
    assert got["logits"].dtype == np.float32 and got["logits"].shape == (16, 10)


def test_cli_torch_modes_on_the_cpu(digits_bundle, tmp_path: Path):
    res = CliRunner().invoke(main, ["profile", str(digits_bundle.root), "--backend", "torch", "--device", "cpu", "--torch-mode",
                                    "auto,eager,cuda-graph", "--batch", "2", "--iterations", "3", "--warmup", "1", "--threads", "1",
                                    "--no-plot", "-o", str(tmp_path)])
    assert res.exit_code == 0, res.output
    cells = json.loads((tmp_path / "profile.json").read_text())["cells"]
    by_mode = {(c["torch_mode"], c["status"]) for c in cells}
    # auto on the CPU resolves to eager (compile is opt-in); cuda-graph is one skipped cell saying why
    assert by_mode == {("eager", "ok"), ("cuda-graph", "skipped")}, by_mode
    skipped = [c for c in cells if c["status"] == "skipped"]
    assert len(skipped) == 1 and "CUDA graphs need a GPU" in skipped[0]["note"]
    ok = [c for c in cells if c["status"] == "ok"]
    assert len(ok) == 2 and all(c["device"] == "cpu" and c["p50_ms"] > 0 and c["device_p50_ms"] is None for c in ok)
    assert all(c["gpu_mem_mb"] is None for c in ok)  # no GPU: empty, not zero
    assert {c["graph"] for c in ok} == {"builtin:digits (torch auto)", "builtin:digits (torch eager)"}
    assert "torch_mode" in (tmp_path / "profile.csv").read_text().splitlines()[0].split(",")


@pytest.mark.parametrize(("args", "message", "code"), [
    (["--backend", "torch", "--device", "cpu", "--torch-mode", "cuda-graph"], "--torch-mode cuda-graph replays CUDA graphs and needs a GPU", 1),
    (["--backend", "torch", "--torch-mode", "jit"], "unknown torch mode 'jit'; choose from auto, eager, cuda-graph, compile", 2),  # usage
    (["--backend", "ort", "--torch-mode", "eager"], "--torch-mode applies to the torch backend; add --backend torch", 1),
])
def test_impossible_torch_modes_are_one_line(digits_bundle, tmp_path: Path, args: list[str], message: str, code: int):
    res = CliRunner().invoke(main, ["profile", str(digits_bundle.root), *args, "--no-plot", "-o", str(tmp_path / "out")])
    assert res.exit_code == code, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], res.output
    assert not (tmp_path / "out").exists()  # refused before anything ran or was written


def test_runner_refuses_cuda_graph_without_a_gpu(digits_bundle):
    from vitdeploy.errors import UserError
    from vitdeploy.exporters.torch_fast import FastTorchRunner

    with pytest.raises(UserError, match="needs a GPU"):
        FastTorchRunner.from_bundle(digits_bundle, device="cpu", mode="cuda-graph")


def _bare_loop_p50_s(model, x, calls: int) -> float:
    """What a PyTorch user times: the model on an already-normalised tensor, nothing else."""
    samples = []
    with torch.inference_mode():
        model(x)
        for _ in range(calls):
            t0 = time.perf_counter()
            model(x)
            samples.append(time.perf_counter() - t0)
    return float(np.median(samples))


@pytest.mark.slow
def test_profile_eager_cell_is_within_1_2x_of_a_bare_pytorch_loop(digits_bundle):
    """The acceptance of issue 14 on the CPU torch path: the profile's torch eager cell (uint8 in,
    normalisation, model, softmax, outputs back as numpy) against a bare `model(x)` loop on a
    normalised tensor, same thread count. On a shared 2-core machine one pair of timings can be off
    by 2x, so the two are interleaved over rounds and the best p50 of each is compared: a slow
    neighbour inflates individual rounds, not the best one of either side (measured ratios and load
    averages: docs/BENCHMARKS.md)."""
    from vitdeploy.exporters.api import loaded_for_bundle
    from vitdeploy.preprocess import normalise
    from vitdeploy.profile import SweepConfig, run_sweep

    batch, calls, rounds, max_rounds = 32, 16, 4, 10
    torch.set_num_threads(1)
    model = loaded_for_bundle(digits_bundle).model.eval()
    x = torch.from_numpy(normalise(_pixels(batch), digits_bundle.preprocessing))
    config = SweepConfig(backends=["torch"], torch_modes=["eager"], batches=[batch], precisions=["fp32"], iterations=calls,
                         warmup=2, threads=1, device="cpu", probe_budget_s=0.02)
    bare, profiled = [], []
    # Noise only ever slows one side's rounds; more rounds can only bring each side's best p50 closer
    # to its unloaded time, so a ratio over 1.2 after 4 rounds earns more rounds (up to 10), not a pass.
    while len(bare) < rounds or (min(profiled) / min(bare) > 1.2 and len(bare) < max_rounds):
        bare.append(_bare_loop_p50_s(model, x, calls))
        row = run_sweep(digits_bundle, config).rows[0]
        assert row["status"] == "ok" and row["torch_mode"] == "eager", row
        profiled.append(row["p50_ms"] / 1e3)
    ratio = min(profiled) / min(bare)
    print(f"\nprofile eager p50 {min(profiled) * 1e3:.2f} ms, bare loop p50 {min(bare) * 1e3:.2f} ms, ratio {ratio:.3f} "
          f"(load average {__import__('os').getloadavg()[0]:.1f})")
    assert ratio <= 1.2, f"profile eager p50 {min(profiled) * 1e3:.2f} ms vs bare loop {min(bare) * 1e3:.2f} ms: {ratio:.2f}x " \
                         f"(rounds: profile {[round(p * 1e3, 2) for p in profiled]}, bare {[round(b * 1e3, 2) for b in bare]})"


@pytest.mark.gpu
def test_cuda_modes_match_the_reference_and_count_device_memory(digits_bundle, tmp_path: Path):
    """On a GPU (scripts/gpu_check.sh): every mode gives the reference's outputs, CUDA events time
    the forward, and the profile's cells report device time and the memory they held (not 0)."""
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    from vitdeploy.exporters.torch_fast import FastTorchRunner
    from vitdeploy.exporters.torch_runner import TorchRunner

    batch = _pixels(8)
    with TorchRunner.from_bundle(digits_bundle) as ref:
        want = ref.infer(batch)["probs"]
    for mode, dtype, atol in (("eager", "fp32", 1e-4), ("cuda-graph", "fp32", 1e-4), ("cuda-graph", "fp16", 2e-2), ("auto", "fp16", 2e-2)):
        with FastTorchRunner.from_bundle(digits_bundle, device="cuda", dtype=dtype, mode=mode) as runner:
            first, again = runner.infer(batch), runner.infer(batch)  # a replayed graph gives the same answer twice
            assert runner.last_device_time_s > 0 and runner.info.details["torch_mode"] in ("eager", "cuda-graph")
        np.testing.assert_allclose(first["probs"], want, atol=atol, rtol=0)
        np.testing.assert_array_equal(first["probs"], again["probs"])
    res = CliRunner().invoke(main, ["profile", str(digits_bundle.root), "--backend", "torch", "--device", "cuda", "--precision", "fp16",
                                    "--torch-mode", "eager,cuda-graph", "--batch", "8", "--iterations", "5", "--warmup", "1",
                                    "--no-plot", "-o", str(tmp_path)])
    assert res.exit_code == 0, res.output
    cells = json.loads((tmp_path / "profile.json").read_text())["cells"]
    from vitdeploy.exporters.api import loaded_for_bundle

    weights_mb = sum(p.numel() for p in loaded_for_bundle(digits_bundle).model.parameters()) * 2 / 2**20
    assert {c["torch_mode"] for c in cells} == {"eager", "cuda-graph"}
    for cell in cells:
        assert cell["status"] == "ok" and cell["device"].startswith("cuda") and cell["device_p50_ms"] > 0
        assert cell["gpu_mem_mb"] >= weights_mb  # fp16 weights at least, plus buffers and activations


def test_device_memory_of_a_cell_is_counted_by_the_right_meter():
    """Issue 14's gpu_mem_mb of 0.0: the driver's used memory cannot see into torch's caching
    allocator, so a torch cell on CUDA is counted by the allocator's peak; other backends by the driver."""
    from vitdeploy.profile.measure import GpuMemoryProbe
    from vitdeploy.runtime.base import RunnerInfo

    probe = GpuMemoryProbe()
    torch_cuda = RunnerInfo("torch", "fp16", "cuda:0")
    ort_cuda = RunnerInfo("onnxruntime", "fp16", "cuda:0")
    # the cached blocks the GEMM probe left behind: driver used does not move, torch's peak does
    assert probe.cell_mb(torch_cuda, driver_before=900.0, torch_before=12.0, driver_after=900.0, torch_peak=215.0) == 203.0
    assert probe.cell_mb(ort_cuda, driver_before=900.0, torch_before=12.0, driver_after=1250.0, torch_peak=12.0) == 350.0
    assert probe.cell_mb(RunnerInfo("torch", "fp32", "cpu"), None, None, None, None) is None
    if not torch.cuda.is_available():
        assert probe.begin() == (probe.used_mb(), None)  # no GPU: nothing to read, nothing reset


# Last in the file: dynamo stays imported and configured afterwards, and the timing test runs before it.
@pytest.mark.slow
def test_compile_mode_traces_the_whole_forward(digits_bundle):
    """torch.compile through dynamo with its `eager` backend: the same graph capture (normalisation,
    model, softmax) as inductor without the C++ build, which takes minutes on a 2-core machine."""
    from vitdeploy.exporters.torch_fast import FastTorchRunner
    from vitdeploy.exporters.torch_runner import TorchRunner

    batch = _pixels(4)
    with FastTorchRunner.from_bundle(digits_bundle, mode="compile", compile_backend="eager", threads=1) as fast, \
            TorchRunner.from_bundle(digits_bundle, threads=1) as ref:
        got = fast.infer(batch)
        assert fast.info.details["torch_mode"] == "compile" and fast.info.details["compile_backend"] == "eager"
        np.testing.assert_allclose(got["logits"], ref.infer(batch)["logits"], atol=1e-4, rtol=0)
