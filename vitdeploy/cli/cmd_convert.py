"""`vitdeploy convert`."""

from __future__ import annotations

import click

from .common import command, echo_json, graph_memory_line, split_csv
from .options import gate_options, json_option, precision_option, reduced_names


@command("convert")
@click.argument("bundle", type=click.Path(exists=True))
@precision_option("fp16: mixed-precision graph (model.fp16.onnx). INT8 needs calibration data: `vitdeploy calibrate`.",
                  names=reduced_names(), best=False, default=None)
@click.option("--target", type=click.Choice(["cpu"]), default=None,
              help="cpu: the fp32 graph with ONNX Runtime's fused attention (model.cpu.onnx), gated against model.onnx; "
                   "the runtime and `profile` use it on CPUs, TensorRT keeps the plain graph.")
@click.option("--keep-fp32", default="",
              help="More kept in fp32, comma-separated: op types (Gelu), modules (blocks.3, head), roles (mlp-fc2) or MODULE/ROLE cells "
                   "(blocks.2/mlp-fc2). LayerNormalization and Softmax always are.")
@click.option("--data", default=None,
              help="Range images for the fp16 range pass (what overflows fp16 on them stays fp32): a folder, .npy, .npz or "
                   "digits:train (the default for the digits bundle; else seeded noise). Labelled data also gates accuracy.")
@click.option("--eval-data", default=None,
              help="Labelled images for the fp16 accuracy gate (default: the digits bundle's test split; else --data when labelled).")
@click.option("--data-max", type=float, default=None,
              help="Range pass threshold: nodes whose values exceed it stay fp32 (default 8188 = fp16's 65504 / 8; inf turns the pass off).")
@click.option("--recipe", "recipe_file", type=click.Path(dir_okay=False),
              help="An fp16 recipe from `vitdeploy debug-precision --precision fp16`: its keep-fp32 list (added to --keep-fp32).")
@gate_options()
@json_option("the fp16 record")
def command(bundle, precision, target, keep_fp32, data, eval_data, data_max, recipe_file, gate, as_json):
    """Add a lower-precision graph (or a CPU-fused graph) to BUNDLE, derived from its fp32 graph.

    The fp16 graph keeps the uint8 input and the fp32 logits/probs outputs; the baked preprocessing,
    every LayerNormalization and Softmax, and what --keep-fp32 names compute in fp32, and so does
    every node whose values exceed --data-max on the range images (a range pass over the fp32 graph:
    residual streams past fp16's range). The graph is gated before it is written (finite outputs,
    logit cosine, and with labelled data accuracy and agreement, as `vitdeploy check`): one that
    fails is not written. Verify it with `vitdeploy check BUNDLE --precision fp16`.

    \b
    Example:
      vitdeploy convert digits-bundle --precision fp16
      vitdeploy convert vits-bundle --precision fp16 --keep-fp32 Gelu
      vitdeploy convert vits-bundle --precision fp16 --data ./calib --eval-data ./val --keep-fp32 blocks.11,blocks.10/mlp-fc2
      vitdeploy convert vits-bundle --precision fp16 --recipe vits-bundle/reports/precision-recipe-fp16.json
      vitdeploy convert vits-bundle --target cpu
    """
    from vitdeploy.bundle import ARTIFACT_FILES, Bundle
    from vitdeploy.errors import UsageError

    if (precision is None) == (target is None):
        raise UsageError("give one of --precision fp16 or --target cpu")
    if target == "cpu":
        from vitdeploy.exporters.cpu_fused import add_cpu_graph_to_bundle
        from vitdeploy.onnx_io import ensure_room
        from vitdeploy.runtime.fused import CPU_FILE, CPU_KEY

        opened = Bundle.open(bundle)
        ensure_room(opened.artifact_path("fp32"), opened.root / CPU_FILE)  # before the passes, not after
        path = add_cpu_graph_to_bundle(opened)
        record = Bundle.open(bundle).artifact_record(CPU_KEY)
        if as_json:
            echo_json(record)
        else:
            click.echo(f"wrote {path.name}: {record['fusion']['attention_fused']} attention blocks fused; ONNX Runtime on CPUs uses it")
            click.echo(graph_memory_line(record))
        return

    if precision == "int8":
        raise UsageError("INT8 needs calibration data: run `vitdeploy calibrate BUNDLE --data DIR` (it writes model.int8.onnx)")
    from vitdeploy.exporters.fp16 import add_fp16_to_bundle

    keep = list(split_csv(keep_fp32))
    if recipe_file is not None:
        from vitdeploy.calibration.recipe_file import fp16_keep, read_recipe

        keep += [k for k in fp16_keep(read_recipe(recipe_file, "fp16")) if k not in keep]
    from vitdeploy.onnx_io import ensure_room

    target = Bundle.open(bundle)
    ensure_room(target.artifact_path("fp32"), target.root / ARTIFACT_FILES["fp16"], 0.5)  # before the range pass, not after
    path = add_fp16_to_bundle(target, keep_fp32_ops=tuple(keep), data=data, eval_data=eval_data, data_max=data_max,
                              gate=gate)
    record = Bundle.open(bundle).artifact_record("fp16")
    if as_json:
        echo_json(record)
        return
    sanity = record.get("sanity", {})
    modules = record.get("user_kept_fp32_modules") or {}
    click.echo(f"wrote {path.name}: fp32 kept for {', '.join(record['kept_fp32_op_types'] + list(modules))} and "
               f"{record['preprocessing_nodes_fp32']} preprocessing nodes; {record['placement']['linear_ops_fp16']}/{record['placement']['linear_ops']} "
               f"linear layers in fp16; seeded-image check: " + _sanity_text(sanity))
    task = (record.get("gate") or {}).get("task")
    if task:
        if task.get("scored") == "embedding":  # an embedding model: no classes
            click.echo(f"gate on {task['data']} ({task['count']} images): embedding cosine p1 {task['cosine_p1']:.4f} "
                       f"(worst {task['cosine_min']:.4f}) against fp32: passed")
        else:
            click.echo(f"gate on {task['data']} ({task['count']} images): fp32 {task['fp32_accuracy']:.2%}, fp16 {task['accuracy']:.2%}, "
                       f"agreement {task['top1_agreement']:.2%}, logit cosine p1 {task['cosine_p1']:.4f}: passed")
    click.echo(graph_memory_line(record))
    mask = record.get("mask_path")
    if mask:  # a variable-size (images, valid_hw) graph
        click.echo(f"variable size: the {mask['mask_path_nodes']} nodes computed from valid_hw (masks, key bias, per-sample position "
                   f"tables) and their {mask['joins']} joins with the image stream kept in fp32; seeded mixed sizes in one padded "
                   "batch vs each image alone through fp32 within the fp16 gate; edge valid_hw rows finite")


def _sanity_text(sanity: dict) -> str:
    """The seeded-image numbers of the scored output; an embedding has no classes, so no agreement."""
    diff = sanity.get("max_abs_logit_diff", float("nan"))
    if sanity.get("output", "logits") != "logits":
        return f"max |d {sanity['output']}| {diff:.2e}"
    return f"max |dlogit| {diff:.2e}, top-1 agreement {sanity.get('top1_agreement', float('nan')):.0%}"
