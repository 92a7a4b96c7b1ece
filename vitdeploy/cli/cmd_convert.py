"""`vitdeploy convert`."""

from __future__ import annotations

import click

from .common import command, echo_json, graph_memory_line, split_csv


@command("convert")
@click.argument("bundle", type=click.Path(exists=True))
@click.option("--precision", type=click.Choice(["fp16", "int8"]), default=None,
              help="fp16: mixed-precision graph (model.fp16.onnx). INT8 needs calibration data: `vitdeploy calibrate`.")
@click.option("--target", type=click.Choice(["cpu"]), default=None,
              help="cpu: the fp32 graph with ONNX Runtime's fused attention (model.cpu.onnx), gated against model.onnx; "
                   "the runtime and `profile` use it on CPUs, TensorRT keeps the plain graph.")
@click.option("--keep-fp32", default="", help="Extra op types kept in fp32, comma-separated (LayerNormalization and Softmax always are).")
@click.option("--json", "as_json", is_flag=True, help="Print the fp16 record as JSON.")
def command(bundle, precision, target, keep_fp32, as_json):
    """Add a lower-precision graph (or a CPU-fused graph) to BUNDLE, derived from its fp32 graph.

    The fp16 graph keeps the uint8 input and the fp32 logits/probs outputs; the baked preprocessing,
    every LayerNormalization and Softmax, and any --keep-fp32 op types compute in fp32, the rest in
    fp16. Verify it with `vitdeploy check BUNDLE --precision fp16`.

    \b
    Example:
      vitdeploy convert digits-bundle --precision fp16
      vitdeploy convert vits-bundle --precision fp16 --keep-fp32 Gelu
      vitdeploy convert vits-bundle --target cpu
    """
    from vitdeploy.bundle import Bundle
    from vitdeploy.errors import UserError

    if (precision is None) == (target is None):
        raise UserError("give one of --precision fp16 or --target cpu")
    if target == "cpu":
        from vitdeploy.runtime.fused import CPU_KEY, add_cpu_graph_to_bundle

        path = add_cpu_graph_to_bundle(Bundle.open(bundle), log=click.echo)
        record = Bundle.open(bundle).artifact_record(CPU_KEY)
        if as_json:
            echo_json(record)
        else:
            click.echo(f"wrote {path.name}: {record['fusion']['attention_fused']} attention blocks fused; ONNX Runtime on CPUs uses it")
            click.echo(graph_memory_line(record))
        return

    if precision == "int8":
        raise UserError("INT8 needs calibration data: run `vitdeploy calibrate BUNDLE --data DIR` (it writes model.int8.onnx)")
    from vitdeploy.exporters.fp16 import add_fp16_to_bundle

    target = Bundle.open(bundle)
    path = add_fp16_to_bundle(target, keep_fp32_ops=tuple(split_csv(keep_fp32)))
    record = Bundle.open(bundle).artifact_record("fp16")
    if as_json:
        echo_json(record)
        return
    sanity = record.get("sanity", {})
    click.echo(f"wrote {path.name}: fp32 kept for {', '.join(record['kept_fp32_op_types'])} and "
               f"{record['preprocessing_nodes_fp32']} preprocessing nodes; seeded-image check: max |dlogit| "
               f"{sanity.get('max_abs_logit_diff', float('nan')):.2e}, top-1 agreement {sanity.get('top1_agreement', float('nan')):.0%}")
    click.echo(graph_memory_line(record))
    mask = record.get("mask_path")
    if mask:  # a variable-size (images, valid_hw) graph
        click.echo(f"variable size: the {mask['mask_path_nodes']} nodes computed from valid_hw (masks, key bias, per-sample position "
                   f"tables) and their {mask['joins']} joins with the image stream kept in fp32; seeded mixed sizes in one padded "
                   "batch vs each image alone through fp32 within the fp16 gate; edge valid_hw rows finite")
