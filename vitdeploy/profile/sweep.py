"""The profile matrix: backend x precision x resolution x batch, each cell measured through the
runner interface and set beside what the cost model says it should cost.

A cell is one (backend, precision, height, width, batch; for a variable-size bundle also a fill
ratio). Each gets its own runner load (so start-up and peak memory belong to it), synthetic feeds of
the graph's own input type (the bundle's input contract), and:

* from the cost model (vitdeploy.costs, chapter §39.5): multiply-adds, attention share, L and the
  attention/MLP crossover L = (2 + rho) d;
* from the clock: the latency distribution, throughput, start-up, memory (vitdeploy.profile.measure);
* achieved GFLOP/s = 2 x MACs / p50 latency, and its share of the machine's GEMM peak measured in the
  same run (vitdeploy.profile.gemm_probe);
* on a Jetson, tegrastats samples taken while the cell ran.

The torch backend runs the fast PyTorch path (``exporters/torch_fast.py``: uint8 upload, normalisation
on the device, ``inference_mode``, CUDA-graph replay or ``torch.compile``), one cell per requested
``--torch-mode``; ``check`` keeps the reference runner that preprocesses on the host.

Cells that cannot exist (PyTorch has no int8 path; fp16 or CUDA graphs on a CPU) are kept in the matrix as
``skipped`` with the reason, so the table says why a row is empty. A cell that fails at run time is
``failed`` with the error and the sweep goes on; bad requests (unknown backend, a size the patches
don't tile, a precision the bundle lacks) are refused before anything runs.

    plan.py   what was asked, validated; the cells     cells.py  each cell's runner and feeds
    rows.py   the row schema, the machine record       sweep.py  the timing loops (this module)
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from ..bundle import Bundle
from ..contract import InputContract
from ..costs import CostReport, vit_costs
from ..errors import VitDeployError
from ..lazy import available, require
from ..runtime.devices import cuda_visible
from . import gemm_probe, tegrastats
from .cells import check_shape, cell_runner, runner_factory, tensorrt_engine_for  # noqa: F401 - re-exported
from .measure import MIN_ITERATIONS, GpuMemoryProbe, LoadedRunner, Measurement, cpu_affinity, current_rss_mb, default_threads, finish, load, measure, timed_calls
from .plan import BACKENDS, PRECISIONS, Cell, SkipCell, SweepConfig, plan_cells  # noqa: F401 - re-exported
from .rows import contract_record, failure_note, machine_info, make_row


@dataclass
class SweepResult:
    bundle: dict[str, Any]
    config: dict[str, Any]
    machine: dict[str, Any]
    peaks: list[gemm_probe.PeakProbe]
    cost_model: dict[str, Any]
    rows: list[dict[str, Any]]
    started: str
    wall_s: float

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["status"] == "failed"]


@dataclass
class SweepContext:
    """What every cell of one sweep shares: the bundle and its contract, the request, the machine's
    threads, GEMM peaks, GPU memory probe and tegrastats, and the progress hooks."""

    bundle: Bundle
    contract: InputContract
    config: SweepConfig
    threads: int
    peaks: list[gemm_probe.PeakProbe]
    gpu: GpuMemoryProbe | None
    tegra_exe: str | None
    on_start: Callable[[Cell, int, int], None] | None = None
    on_done: Callable[[Cell, dict[str, Any]], None] | None = None
    on_round: Callable[[int, int], None] | None = None

    def peak_for(self, m: Measurement, cell: Cell) -> gemm_probe.PeakProbe | None:
        return gemm_probe.peak_for(self.peaks, m.runner.get("device", "cpu"), cell.precision)

    def note(self, m: Measurement) -> str:
        return f"unstable: CV {m.latency.cv:.0%} > {self.config.cv_threshold:.0%}" if m.unstable else ""


def run_sweep(
    bundle: Bundle,
    config: SweepConfig,
    on_start: Callable[[Cell, int, int], None] | None = None,
    on_done: Callable[[Cell, dict[str, Any]], None] | None = None,
    on_round: Callable[[int, int], None] | None = None,
) -> SweepResult:
    """Plan, probe the machine's GEMM peak, then measure every cell: one after the other, or with
    ``config.rounds`` all loaded and timed in interleaved rounds (``on_round(r, rounds)`` per round)."""
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    t_start = time.perf_counter()
    cells = plan_cells(bundle, config)
    contract = InputContract.from_bundle(bundle)
    threads = config.threads or default_threads()
    backends = sorted({c.backend for c in cells})
    spec = bundle.spec
    # An in-graph resize runs the model at a fixed size whatever the input: the cost is at that size.
    model_size = contract.in_graph_resize

    if "torch" in backends and any(c.skip_reason is None and c.backend == "torch" for c in cells):
        require("torch", "the torch backend")  # loaded before the probe so the probe can use it
    # Cells may run on a GPU (tensorrt always; ort and torch unless --device cpu): then the GPU's
    # GEMM peak is probed with torch where torch is installed, and device memory is tracked.
    cuda = config.device != "cpu" and cuda_visible()
    if cuda and "torch" not in sys.modules and available("torch"):
        require("torch")
    gpu = GpuMemoryProbe() if cuda else None

    with _pinned(threads if config.pin else None):
        # Probed under the same pinning as the cells, so the peak is that of the cores they run on.
        peaks = gemm_probe.measure_peaks(threads, set(backends), cuda, budget_s=config.probe_budget_s)
        pinned_to = cpu_affinity()
        ctx = SweepContext(bundle, contract, config, threads, peaks, gpu, tegrastats.find_tegrastats(), on_start, on_done, on_round)
        costs = [cell_cost(bundle, c, model_size) for c in cells]
        rows = run_interleaved(ctx, cells, costs) if config.rounds else run_in_turn(ctx, cells, costs)

    first_cost = vit_costs(spec, *(model_size or (cells[0].height, cells[0].width)), 1)
    return SweepResult(
        bundle={
            "path": str(bundle.bare_onnx or bundle.root),
            "name": bundle.name,
            "source": bundle.manifest.get("source"),
            "spec": spec.to_dict(),
            "resolution": bundle.resolution,
            "precisions": bundle.precisions(),
            **contract_record(contract),
        },
        config=config.to_dict(),
        machine={**machine_info(threads, backends, cells), "pinned_cpus": pinned_to if config.pin else None},
        peaks=peaks,
        cost_model={
            "convention": "1 MAC = one multiply-add; FLOPs = 2 x MACs; biases, norms, softmax and GELU not counted (chapter §39.5)",
            "crossover_seq_len": first_cost.crossover_seq_len,
            "params": first_cost.params,
            "embed_dim": spec.embed_dim,
            "mlp_ratio": spec.mlp_ratio,
            "depth": spec.depth,
        },
        rows=rows,
        started=started,
        wall_s=time.perf_counter() - t_start,
    )


def run_in_turn(ctx: SweepContext, cells: list[Cell], costs: list[CostReport]) -> list[dict[str, Any]]:
    """Every cell measured to the end before the next one loads."""
    rows = []
    for i, (cell, cost) in enumerate(zip(cells, costs)):
        if ctx.on_start:
            ctx.on_start(cell, i, len(cells))
        row = make_row(cell, cost, None, "skipped", cell.skip_reason) if cell.skip_reason else run_cell(ctx, cell, cost)
        rows.append(row)
        if ctx.on_done:
            ctx.on_done(cell, row)
    return rows


def run_interleaved(ctx: SweepContext, cells: list[Cell], costs: list[CostReport]) -> list[dict[str, Any]]:
    """Load every cell's runner (start-up and memory measured one at a time), then time the cells in
    rounds, forward and backward in turn (A B C, C B A, ...): load from other processes, clock and
    thermal drift fall on every cell alike, so cells compare fairly on a shared or throttling
    machine. Each block starts with one untimed call, so a cell is timed warm, as in the sequential
    mode, not right after another model evicted its weights from the caches. Peak RSS is then that
    of the whole sweep (all runners resident); ``rss_added_mb`` is what each runner added when it
    was loaded."""
    config = ctx.config
    rounds = int(config.rounds or 2)
    total = config.iterations if config.iterations is not None else max(MIN_ITERATIONS, rounds)
    blocks = [total // rounds + (1 if r < total % rounds else 0) for r in range(rounds)]
    rows: list[dict[str, Any] | None] = [None] * len(cells)
    loaded: dict[int, tuple[LoadedRunner, str, float | None]] = {}
    for i, (cell, cost) in enumerate(zip(cells, costs)):
        if ctx.on_start:
            ctx.on_start(cell, i, len(cells))
        if cell.skip_reason:
            rows[i] = make_row(cell, cost, None, "skipped", cell.skip_reason)
            continue
        graph = None
        try:
            runs = cell_runner(ctx.bundle, ctx.contract, cell, config, ctx.threads)
            graph = runs.what
            lr = load(runs.make, runs.feeds, warmup=config.warmup, gpu=ctx.gpu, on_runner=lambda r, c=cell: check_shape(r, c))
            after = current_rss_mb()
            loaded[i] = (lr, graph, after - lr.rss_before_mb if after is not None and lr.rss_before_mb is not None else None)
        except SkipCell as exc:
            rows[i] = make_row(cell, cost, graph, "skipped", str(exc))
        except Exception as exc:  # one cell's load failure must not end the sweep
            rows[i] = make_row(cell, cost, graph, "failed", failure_note(exc))
    sampler = tegrastats.TegrastatsSampler(ctx.tegra_exe, config.tegrastats_interval_ms) if ctx.tegra_exe else None
    with sampler if sampler is not None else contextlib.nullcontext():
        for r, block in enumerate(blocks):
            if ctx.on_round:
                ctx.on_round(r, rounds)
            order = sorted(loaded) if r % 2 == 0 else sorted(loaded, reverse=True)
            for i in order:
                try:
                    lr = loaded[i][0]
                    lr.runner.run(lr.feeds)  # untimed: re-warms caches and thread pools after the switch
                    timed_calls(lr, iterations=block)
                except Exception as exc:
                    lr, graph, _ = loaded.pop(i)
                    lr.runner.close()
                    rows[i] = make_row(cells[i], costs[i], graph, "failed", failure_note(exc))
    tegra = sampler.summary() if sampler is not None else None
    for i, (lr, graph, added) in sorted(loaded.items()):
        m = finish(lr, config.cv_threshold, ctx.gpu, rss_scope="sweep", rss_added_mb=added, gpu_scope="load")
        # tegrastats ran over the whole interleaved phase: the same sweep-wide summary on every row
        rows[i] = make_row(cells[i], costs[i], graph, "ok", ctx.note(m), m, ctx.peak_for(m, cells[i]), tegra)
    out = [row for row in rows if row is not None]
    if ctx.on_done:
        for cell, row in zip(cells, out):
            ctx.on_done(cell, row)
    return out


@contextlib.contextmanager
def _pinned(count: int | None) -> Iterator[None]:
    """Restrict this process (and the runtime threads it starts) to its first ``count`` CPUs, then
    restore the mask: fewer migrations and no hyper-thread siblings borrowed mid-run."""
    if not count:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, sorted(before)[:count])
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def run_cell(ctx: SweepContext, cell: Cell, cost: CostReport) -> dict[str, Any]:
    """One cell measured on its own: loaded, warmed up, timed, closed (tegrastats sampled meanwhile)."""
    config = ctx.config
    graph = None
    try:
        runs = cell_runner(ctx.bundle, ctx.contract, cell, config, ctx.threads)
        graph = runs.what

        def run() -> Measurement:
            return measure(runs.make, runs.feeds, warmup=config.warmup, iterations=config.iterations, duration_s=config.duration_s,
                           cv_threshold=config.cv_threshold, gpu=ctx.gpu, on_runner=lambda r: check_shape(r, cell))

        if ctx.tegra_exe:
            with tegrastats.TegrastatsSampler(ctx.tegra_exe, config.tegrastats_interval_ms) as sampler:
                m = run()
            tegra = sampler.summary()
        else:
            m, tegra = run(), None
    except SkipCell as exc:
        return make_row(cell, cost, graph, "skipped", str(exc))
    except VitDeployError as exc:
        return make_row(cell, cost, graph, "failed", str(exc))
    except Exception as exc:  # a runtime error (ORT, torch, TensorRT) in one cell must not end the sweep
        return make_row(cell, cost, graph, "failed", failure_note(exc))
    return make_row(cell, cost, graph, "ok", ctx.note(m), m, ctx.peak_for(m, cell), tegra)


def cell_cost(bundle: Bundle, cell: Cell, model_size: tuple[int, int] | None) -> CostReport:
    """The cost model's numbers for a cell; a graph that merges tokens (--merge-tokens, or a merged
    bundle) gets the merged MACs, the merge itself included (vitdeploy.costs.merge_costs)."""
    import dataclasses

    from .plan import merge_schedule_for

    height, width = model_size or (cell.height, cell.width)
    cost = vit_costs(bundle.spec, height, width, cell.batch)
    schedule = merge_schedule_for(bundle, cell)
    if not schedule:
        return cost
    from ..costs import merge_costs

    merged = merge_costs(bundle.spec, schedule, height, width, cell.batch)
    return dataclasses.replace(cost, macs_total=merged.macs_total, flops_total=2 * merged.macs_total)
