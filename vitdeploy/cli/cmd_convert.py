"""`vitdeploy convert`."""

from __future__ import annotations

import click

from .common import command, echo_json, split_csv


@command("convert")
@click.argument("bundle", type=click.Path(exists=True))
@click.option("--precision", type=click.Choice(["fp16", "int8"]), required=True,
              help="fp16: mixed-precision graph (model.fp16.onnx). INT8 needs calibration data: `vitdeploy calibrate`.")
@click.option("--keep-fp32", default="", help="Extra op types kept in fp32, comma-separated (LayerNormalization and Softmax always are).")
@click.option("--json", "as_json", is_flag=True, help="Print the fp16 record as JSON.")
def command(bundle, precision, keep_fp32, as_json):
    """Add a lower-precision graph to BUNDLE, derived from its fp32 graph.

    The fp16 graph keeps the uint8 input and the fp32 logits/probs outputs; the baked preprocessing,
    every LayerNormalization and Softmax, and any --keep-fp32 op types compute in fp32, the rest in
    fp16. Verify it with `vitdeploy check BUNDLE --precision fp16`.

    \b
    Example:
      vitdeploy convert digits-bundle --precision fp16
      vitdeploy convert vits-bundle --precision fp16 --keep-fp32 Gelu
    """
    from vitdeploy.bundle import Bundle
    from vitdeploy.errors import UserError

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
