"""What runs one profile cell and what it is timed on.

- ort: the bundle's graph of the cell's precision (a re-export at another size for a static graph,
  cached in the bundle by the exporters; on CPUs the fp32 cell runs the fused model.cpu.onnx where
  there is one), resolved by vitdeploy.runtime.select;
- tensorrt: the bundle's engine of the cell's precision whose optimisation profile holds the cell's
  batch and size (the one place engine profiles are matched: vitdeploy.runtime.engines);
- torch: the fast PyTorch path (exporters/torch_fast.py), or for a variable-size bundle the masked
  forward the graph was exported from (vitdeploy.profile.variable).

The input is synthetic feeds of the loaded runner's own input type, built by the bundle's input
contract: uint8 NHWC pixels (float NCHW for raw graphs), and for a variable-size cell the
``valid_hw`` rows drawn for its fill ratio.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..bundle import Bundle
from ..contract import InputContract
from ..errors import UserError
from ..runtime.base import Runner
from .plan import Cell, SkipCell, SweepConfig, cell_valid_hw, torch_device

Feeds = dict  # the runner's named inputs


@dataclass
class CellRunner:
    make: Callable[[], Runner]  # a zero-argument constructor (timed as start-up)
    what: str  # the graph, engine or model that runs (the report's "graph" column)
    feeds: Callable[[Runner], Feeds]  # the cell's input, from the loaded runner's own input type


def graph_path(bundle: Bundle, precision: str, height: int, width: int, merge: int | None = None) -> Path:
    """The ONNX graph that runs a cell: the bundle's own for a dynamic graph or the native size of a
    static one; otherwise a re-export at that size, cached in the bundle by the exporters. ``merge``
    (--merge-tokens): the graph merging r tokens per block, a re-export unless it is the bundle's own."""
    res = bundle.resolution
    native = (int(res.get("height", bundle.spec.image_size[0])), int(res.get("width", bundle.spec.image_size[1])))
    if merge is not None:
        own = tuple((bundle.manifest.get("token_merge") or {}).get("schedule") or (0,) * bundle.spec.depth)
        if (height, width) != native or own != (merge,) * bundle.spec.depth:
            from vitdeploy.exporters.variants import graph_for

            return Path(graph_for(bundle, precision, height, width, merge=merge))
    if res.get("mode") == "dynamic" or (height, width) == native:
        return bundle.artifact_path(precision)
    from vitdeploy.exporters.variants import graph_for  # needs torch; checked in plan_cells

    return Path(graph_for(bundle, precision, height, width))


def cell_runner(bundle: Bundle, contract: InputContract, cell: Cell, config: SweepConfig, threads: int) -> CellRunner:
    """The cell's runner constructor, what it runs, and its feeds."""
    make, what = runner_factory(bundle, cell, config, threads, contract)

    def feeds(runner: Runner) -> Feeds:
        valid = cell_valid_hw(contract, cell, config.seed) if cell.fill is not None else None
        return contract.random_feeds(cell.batch, cell.height, cell.width, config.seed, runner.inputs()[0].dtype, valid)

    return CellRunner(make, what, feeds)


def runner_factory(bundle: Bundle, cell: Cell, config: SweepConfig, threads: int,
                   contract: InputContract | None = None) -> tuple[Callable[[], Runner], str]:
    """A zero-argument constructor for the cell's runner (timed as start-up) and what it runs."""
    from ..runtime import select

    contract = contract or InputContract.from_bundle(bundle)
    if cell.backend == "ort":
        providers = select.ort_providers(config.device)
        path = graph_path(bundle, cell.precision, cell.height, cell.width, cell.merge)
        if path == bundle.artifact_path(cell.precision):  # the bundle's own graph: fused on CPUs where there is one
            from ..runtime.ort import default_providers

            cuda = "CUDAExecutionProvider" in (providers or default_providers())
            path = select.graph_for(bundle, cell.precision, cuda, config.fused_cpu)

        def make() -> Runner:
            return select.onnxruntime_runner(bundle, contract, cell.precision, providers, threads, config.ort_optimization,
                                             graph=path).runner

        return make, relative(bundle, path)
    if cell.backend == "torch":
        device = torch_device(config)
        source = bundle.manifest.get("source", {})
        if cell.fill is not None:  # a canvas cell: the masked forward the graph was exported from, fed (images, valid_hw)
            from .variable import VariableTorchRunner

            def make() -> Runner:
                return VariableTorchRunner(bundle, contract, (cell.height, cell.width), device=device, threads=threads)

            return make, f"{source.get('kind', 'source')}:{source.get('name', '?')} (torch eager, masked forward)"
        # The fast path (uint8 upload, normalisation on the device, CUDA graphs / torch.compile): the
        # PyTorch baseline a careful user runs. `check` keeps the host-preprocessing reference runner.
        from vitdeploy.exporters.torch_fast import FastTorchRunner

        # Runners are built for the native grid and re-gridded by the exporters for other sizes.
        resolution = (cell.height, cell.width)
        mode = cell.torch_mode or "auto"

        def make() -> Runner:
            return FastTorchRunner.from_bundle(bundle, device=device, dtype=cell.precision, resolution=resolution, threads=threads, mode=mode)

        return make, f"{source.get('kind', 'source')}:{source.get('name', '?')} (torch {mode})"
    if cell.backend == "tensorrt":
        entry = tensorrt_engine_for(bundle, cell)  # its profile holds the cell's batch on every input (build-engine)

        def make() -> Runner:
            return select.open_engine(entry)  # GPU only; TensorRT is imported when a cell needs it

        return make, relative(bundle, entry.dir)
    raise UserError(f"unknown backend {cell.backend!r}")


def tensorrt_engine_for(bundle: Bundle, cell: Cell) -> Any:
    """The bundle's engine of the cell's precision whose optimisation profile holds its
    (batch, height, width); a cell no engine covers is skipped with what to build."""
    from ..runtime.engines import find_engines

    engines = [e for e in find_engines(bundle) if e.precision == cell.precision]
    for entry in engines:
        if entry.profile_for(cell.height, cell.width, cell.batch) is not None:
            return entry
    have = "; ".join(f"{e.target}: {e.profiles}" for e in engines) or "none"
    raise SkipCell(f"no {cell.precision} engine has a profile holding batch {cell.batch} at {cell.height}x{cell.width} "
                   f"(engines: {have}); build one with `vitdeploy build-engine {bundle.root}`")


def relative(bundle: Bundle, path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(bundle.root.resolve()))
    except ValueError:
        return str(path)


def check_shape(runner: Runner, cell: Cell) -> None:
    shape = runner.inputs()[0].shape
    if shape and isinstance(shape[0], int) and shape[0] != cell.batch:
        raise SkipCell(f"the graph has a fixed batch of {shape[0]}; export with a dynamic batch to profile batch {cell.batch}")
