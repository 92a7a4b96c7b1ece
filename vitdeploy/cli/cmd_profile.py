"""`vitdeploy profile`."""

from __future__ import annotations

import click

from ..errors import UserError
from ..spec import parse_resolution
from .common import command, echo_json, parse_int_list, split_csv, warn_random_weights
from .. import precisions as registry
from .options import json_option, precision_list_option
from ..remote.cli import on_device


@command("profile")
@on_device(inputs=("layer_profile", "layer_info", "trtexec_log"), outputs=("out_dir",))  # --on HOST: run on a device over ssh (vitdeploy/remote)
@click.argument("bundle")
@click.option("--resolutions", default=None, help="Comma-separated N or HxW (default: the bundle's native size).")
@click.option("--fill", "fills", default=None, metavar="F1,F2",
              help="Variable-size bundles: comma-separated fill ratios in (0, 1], mean valid area / canvas area, one cell each "
                   "[default: 1.0,0.5,0.25]; sizes drawn by a declared seeded rule (whole patches, every aspect ratio that fits).")
@click.option("--batch", "batches", default="1", show_default=True, help="Comma-separated batch sizes.")
@precision_list_option(f"Comma-separated {', '.join(registry.NAMES)} (default: every graph in the bundle).", param="precisions")
@click.option("--backend", "backends", default="ort", show_default=True, help="Comma-separated ort, torch, tensorrt.")
@click.option("--iterations", type=int, default=None, help="Timed calls per cell (instead of --duration).")
@click.option("--duration", type=float, default=None, help="Seconds of timed calls per cell, at least 10 calls [default: 3].")
@click.option("--rounds", type=int, default=None,
              help="Load every cell, then time them interleaved over this many rounds (fair on a busy machine).")
@click.option("--warmup", type=int, default=10, show_default=True, help="Untimed calls per cell before timing.")
@click.option("--threads", type=int, default=None, help="Intra-op threads for CPU backends [default: every CPU this process may use].")
@click.option("--pin", is_flag=True, help="Also pin the process to the first --threads CPUs it may use (Linux).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Where torch runs, and whether ort uses its CUDA provider.")
@click.option("--torch-mode", "torch_modes", default=None,
              help="Comma-separated eager, cuda-graph, compile, auto: how the torch backend runs, one cell each "
                   "[default: auto, the faster of cuda-graph and eager on a GPU, eager on the CPU; compile only when named].")
@click.option("--cv-threshold", type=float, default=0.10, show_default=True, help="Flag a cell unstable above this coefficient of variation.")
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write the reports here instead of the bundle's reports/ folder.")
@click.option("--no-plot", is_flag=True, help="Skip reports/profile.png.")
@json_option(help="Print the JSON report instead of the table.")
@click.option("--plain-graph", is_flag=True, help="On CPUs run model.onnx even where the bundle has the fused model.cpu.onnx (`convert --target cpu`).")
@click.option("--accuracy", "accuracy_data", default=None, metavar="SOURCE",
              help="Also score each (backend, precision, resolution) on labelled data (digits:test, DIR/<class>/<image>, .npz): "
                   "accuracy columns and reports/profile_accuracy.png (accuracy against latency).")
@click.option("--merge-tokens", "merge_tokens", default=None, metavar="R1,R2,...",
              help="Token merging trade-off: one graph per r (tokens merged in every block; 0 = unmerged), re-exported from the "
                   "bundle's source and timed on ort; with --accuracy also each r's accuracy and agreement with r=0.")
@click.option("--wide", is_flag=True, help="Every column and every cell in the table (default: fits 120 columns, skipped cells in one line).")
@click.option("--layers", "layers", is_flag=True,
              help="Per-layer TensorRT profile of the bundle's engine: trtexec --exportProfile/--exportLayerInfo (run here, or the "
                   "command printed), mapped to blocks.N attention/MLP, patch embedding and head, with the cost model's MACs.")
@click.option("--engine", "engine", metavar="NAME", help="With --layers: the engine folder under engines/ (default: the only one).")
@click.option("--layer-profile", type=click.Path(exists=True, dir_okay=False), help="With --layers: a trtexec --exportProfile JSON, or a log with --dumpProfile, from the device.")
@click.option("--layer-info", type=click.Path(exists=True, dir_okay=False), help="With --layers: the matching trtexec --exportLayerInfo JSON.")
@click.option("--trtexec-log", type=click.Path(exists=True, dir_okay=False), help="With --layers: that run's trtexec log (device, options).")
@click.option("--trtexec", "trtexec_path", metavar="PATH", help="With --layers: the trtexec to run (default: on PATH, else /usr/src/tensorrt/bin/trtexec).")
def command(bundle, resolutions, fills, batches, precisions, backends, iterations, duration, rounds, warmup, threads, pin, device, torch_modes,
            cv_threshold, out_dir, no_plot, as_json, plain_graph, wide, accuracy_data, layers, engine, layer_profile, layer_info,
            trtexec_log, trtexec_path, merge_tokens):
    """Latency and throughput across resolutions, batch sizes, precisions and backends, beside the cost model.

    Each cell gets its own runner load (start-up = load to first result), a warm-up, then a fixed
    number of timed calls or a time budget: p50/p90/p99, mean, std, min, throughput, peak memory,
    the coefficient of variation (flagged when unstable), the cost model's multiply-adds, achieved
    GFLOP/s and its share of this machine's GEMM peak measured in the same run. On a Jetson,
    tegrastats is sampled during each cell and the nvpmodel / jetson_clocks state is recorded.
    Writes reports/profile.csv, profile.json and profile.png. With --rounds, every cell is loaded
    first and the timed calls are interleaved (A B C, C B A, ...), so load from other processes or
    thermal drift falls on all cells alike.

    The torch backend is the PyTorch baseline a careful user runs: uint8 upload, normalisation on the
    device, inference_mode, and on a GPU CUDA-graph replay (or torch.compile), with device time from
    CUDA events beside the host p50 and the device memory the cell held.

    A variable-size bundle (export --variable-size) is profiled by canvas (--resolutions, default its
    own; others are re-exported) and fill ratio (--fill): each cell feeds the canvas with valid_hw
    sizes drawn for its fill; the reports gain canvas, fill and fill_actual columns.

    \b
    Example:
      vitdeploy profile digits-bundle
      vitdeploy profile vits --resolutions 160,224,288,384 --batch 1,8 --precision fp32,int8 --backend ort,torch
      vitdeploy profile vits --resolutions 160,224,288,384 --batch 1,8 --iterations 20 --rounds 10
      vitdeploy profile vits --resolutions 224x320 --iterations 200 --threads 4 --pin --json
      vitdeploy profile digits-bundle --resolutions 24,32,48 --precision fp32,int8 --accuracy digits:test
      vitdeploy profile vitb --backend torch --device cuda --precision fp16 --batch 1,8,64 --torch-mode eager,cuda-graph,compile
      vitdeploy profile digits-variable --fill 1.0,0.5,0.25 --batch 1,8 --backend ort,torch
      vitdeploy profile digits-bundle --merge-tokens 0,2,4,8 --accuracy digits:test --rounds 5 --iterations 50
      vitdeploy profile vitb --layers --batch 8                      # on the device, after build-engine --profile-layers
      vitdeploy profile vitb --layers --layer-profile prof.json --layer-info layers.json --trtexec-log run.log
    """
    warn_random_weights(bundle)
    if layers:
        _layers(bundle, engine, layer_profile, layer_info, trtexec_log, trtexec_path, batches, resolutions, out_dir, as_json)
        return
    from ..console import get_console
    from ..profile import SweepConfig, profile_bundle
    from ..profile.report import render_table, to_json

    from ..profile.variable import parse_fills

    config = SweepConfig(
        resolutions=[parse_resolution(r) for r in split_csv(resolutions)] or None,
        fills=parse_fills(split_csv(fills)) if fills is not None else None,
        batches=parse_int_list(batches, "--batch"),
        precisions=split_csv(precisions) or None,
        backends=split_csv(backends),
        iterations=iterations,
        duration_s=duration,
        rounds=rounds,
        warmup=warmup,
        threads=threads,
        pin=pin,
        device=device,
        torch_modes=split_csv(torch_modes) or None,
        cv_threshold=cv_threshold,
        fused_cpu=not plain_graph,
        merge_tokens=_merge_values(merge_tokens) if merge_tokens is not None else None,
    )
    outcome = profile_bundle(bundle, config, out_dir=out_dir, plot=not no_plot, progress_console=get_console(stderr=True),
                             accuracy=accuracy_data)
    result = outcome.result
    if as_json:
        echo_json(to_json(result))
    else:
        render_table(result, get_console(), wide=wide)
        if accuracy_data:
            from ..profile.accuracy import render_accuracy

            render_accuracy(result, get_console())
        if merge_tokens is not None:
            from ..profile.merge_report import render_merge_table

            render_merge_table(result, get_console())
        for kind, path in outcome.paths.items():
            click.echo(f"{kind}: {path}")
    failed = result.failed
    if failed:
        first = failed[0]
        raise UserError(f"{len(failed)} of {len(result.rows)} cells failed (reports written); first: "
                        f"{first['backend']} {first['precision']} {first['height']}x{first['width']} b{first['batch']}: {first['note']}")


def _layers(bundle, engine, layer_profile, layer_info, trtexec_log, trtexec_path, batches, resolutions, out_dir, as_json):
    """`profile --layers`: time per ViT block inside the TensorRT engine (vitdeploy.profile.layer_report)."""
    from ..profile.layer_report import LayerRequest, run

    ctx = click.get_current_context()
    explicit = lambda name: ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT  # noqa: E731
    batch = parse_int_list(batches, "--batch")[0] if explicit("batches") else None
    sizes = [parse_resolution(r) for r in split_csv(resolutions)]
    outcome = run(LayerRequest(bundle, engine, layer_profile, layer_info, trtexec_log, batch, sizes[0] if sizes else None, out_dir,
                               trtexec_path))
    if as_json and outcome.report is not None:
        echo_json(outcome.report)
    else:
        for line in outcome.lines:
            click.echo(line)
        for kind, path in outcome.paths.items():
            click.echo(f"{kind}: {path}")
    if outcome.exit_code:
        ctx.exit(outcome.exit_code)


def _merge_values(text: str) -> list[int]:
    """--merge-tokens 0,4,8,12 -> [0, 4, 8, 12] (0 is the unmerged graph every speed-up is taken against)."""
    try:
        values = [int(v) for v in split_csv(text)]
    except ValueError:
        values = []
    if not values or any(v < 0 for v in values):
        raise click.BadParameter(f"--merge-tokens takes comma-separated r values >= 0, e.g. 0,4,8,12; got {text!r}")
    return list(dict.fromkeys(values))
