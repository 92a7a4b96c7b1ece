"""`vitdeploy build-engine`: a TensorRT engine for this GPU or Jetson, or its plan, trtexec line, DLA report."""

from __future__ import annotations

import logging

import click

from .common import command, warn_random_weights
from .options import best_rule, graph_files, precision_option
from ..engine import knobs
from ..remote.cli import on_device


def knob_options(f):
    """One click option per build knob, from its declaration in ``vitdeploy.engine.knobs``."""
    for knob in reversed(knobs.KNOBS):  # click lists options in decoration order, the innermost last
        if knob.cli_kind == "choice":
            extra = {"type": click.Choice(list(knob.cli_choices)), "default": knob.default, "show_default": True}
        else:
            extra = {"value": {}, "int": {"type": int}, "path": {"type": click.Path(dir_okay=False)},
                     "flag": {"is_flag": True}, "no-flag": {"is_flag": True}}[knob.cli_kind]
        f = click.option(*knob.cli, metavar=knob.cli_metavar, help=knob.cli_help, **extra)(f)
    return f


def knob_values(kw: dict) -> dict:
    """PlanOptions' knob fields from the parsed options (a --no-X flag sets its knob False)."""
    return {k.option: (not kw[k.cli[-1]]) if k.cli_kind == "no-flag" else kw[k.cli[-1]] for k in knobs.KNOBS}


@command("build-engine")
@on_device(inputs=("calib_data", "calib_cache", "timing_cache"), outputs=("calib_cache", "timing_cache"))  # --on HOST
@click.argument("bundle", type=click.Path())
@precision_option(f"Which graph to compile: {graph_files()}; best = {best_rule()}.", best_first=False)
@click.option("--legacy-precision", is_flag=True,
              help="TensorRT < 11 only: fp32 graph + FP16/INT8 builder flags (+ entropy calibrator for int8).")
@click.option("--batch", "batch", multiple=True, metavar="MIN:OPT:MAX",
              help="Batch range of a profile (default 1:8:32; 1 with --dla-core). Repeat for several profiles.")
@click.option("--resolution", "resolution", multiple=True, metavar="MIN:OPT:MAX",
              help="H/W range of a profile for dynamic-resolution graphs, e.g. 224:224:384 or 224x320. Repeatable.")
@knob_options
@click.option("--calib-data", type=click.Path(dir_okay=False), help="Legacy INT8: uint8 images [N,H,W,3] as .npy.")
@click.option("--calib-cache", type=click.Path(dir_okay=False), help="Legacy INT8: calibration cache to read/write.")
@click.option("--calib-batch", type=int, default=8, show_default=True, help="Legacy INT8: calibration batch size.")
@click.option("--target", help="Engine folder under engines/ (default: <gpu>-trt<version>-<precision>); a Jetson target "
              "name (jp6.2-orin-nano, jp7.1-agx-thor: `vitdeploy targets`) also plans that target's TensorRT and DLA.")
@click.option("--trt-version", help="Plan for this TensorRT version instead of the installed one (dry runs, trtexec line).")
@click.option("--dry-run", is_flag=True, help="Validate the plan, write reports/engine-plan-<target>.json; no TensorRT or GPU needed.")
@click.option("--print-trtexec", is_flag=True, help="Print the equivalent trtexec command (without building).")
@click.option("--dla-report", is_flag=True, help="DLA feasibility report from the ONNX graph (no GPU or TensorRT needed).")
@click.option("--lint", "lint", is_flag=True,
              help="Only list the nodes the target TensorRT's ONNX parser cannot take (rule + source); writes nothing.")
def command(bundle: str, **kw: object) -> None:
    """Compile a bundle's graph into a TensorRT engine on this device.

    Engines are tied to the GPU, the TensorRT version and the platform, so they are built where they
    run. The result is engines/<target>/model.plan and engine.json (TensorRT version, GPU, compute
    capability, JetPack, profiles, precision path, source graph hash), which is checked before loading.
    TensorRT >= 10 builds the bundle's graph of the chosen precision strongly typed; 11 has only
    that path. TensorRT 8.5/8.6 (JetPack 5.1/6.0) parse opset 17 without Gelu (8.5: without
    LayerNormalization): for them the graph is lowered (model*.trt8.x.onnx), verified with ONNX
    Runtime, and that is what TensorRT parses. --precision fp16 makes a missing fp16 graph.

    \b
    Example:
      vitdeploy build-engine bundle --precision fp16 --batch 1:8:32
      vitdeploy build-engine bundle --resolution 224:224:384 --timing-cache trt.cache
      vitdeploy build-engine bundle --dry-run --print-trtexec --trt-version 10.3
      vitdeploy build-engine bundle --precision int8 --dla-core 0 --batch 1
      vitdeploy build-engine bundle --precision fp16 --dla-report
      vitdeploy build-engine bundle --lint --trt-version 8.6
      vitdeploy build-engine bundle --dry-run --trt-version 8.5 --precision int8
      vitdeploy build-engine bundle --dry-run --print-trtexec --target jp7.1-agx-thor --precision fp16
      vitdeploy build-engine bundle --precision fp16 --strip-weights --version-compatible
    """
    warn_random_weights(bundle)
    from ..engine.plan import PlanOptions
    from ..engine.service import BuildEngineRequest, run

    options = PlanOptions(
        precision=kw["precision"], legacy_precision=kw["legacy_precision"], batch=tuple(kw["batch"]),
        resolution=tuple(kw["resolution"]), **knob_values(kw),
        calib_data=kw["calib_data"], calib_cache=kw["calib_cache"], calib_batch=kw["calib_batch"], target=kw["target"],
    )  # type: ignore[arg-type]
    request = BuildEngineRequest(bundle, options, kw["trt_version"], kw["dry_run"], kw["print_trtexec"], kw["dla_report"], kw["lint"])  # type: ignore[arg-type]
    outcome = run(request, log=logging.getLogger(run.__module__).info)  # progress lines: the service's logger
    for line in outcome.lines:
        click.echo(line)
    if outcome.exit_code:
        click.get_current_context().exit(outcome.exit_code)
