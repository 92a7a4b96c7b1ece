"""`vitdeploy debug-precision`."""

from __future__ import annotations

import click

from .common import command, echo_json, split_csv
from .options import gate_options, json_option, precision_option, reduced_names


@command("debug-precision")
@click.argument("bundle", type=click.Path(exists=True))
@precision_option("The reduced precision to debug.", names=reduced_names("best"), best=False, required=True)
@click.option("--data", default=None,
              help="int8: calibration images; fp16: range images (default: digits:train for the digits bundle).")
@click.option("--samples", type=click.IntRange(min=1), default=512, show_default=True, help="int8: calibration images to use.")
@click.option("--eval-data", default=None,
              help="Labelled held-out images every trial is scored on: DIR/<class>/<image>, a .npz with images + labels, or digits:test "
                   "(the default for the digits bundle).")
@click.option("--eval-limit", type=click.IntRange(min=1), default=None, help="Score on at most this many held-out images.")
@click.option("--method", type=click.Choice(["entropy", "minmax", "percentile"]), default="entropy", show_default=True,
              help="int8: the calibration method of every trial.")
@click.option("--smooth", type=click.Choice(["none", "layernorm", "all"]), default="none", show_default=True,
              help="int8: the smoothing of every trial (see `vitdeploy calibrate --smooth`).")
@click.option("--smooth-alpha", type=click.FloatRange(0.0, 1.0), default=0.5, show_default=True, help="int8: smoothing strength.")
@click.option("--target", type=click.Choice(["tensorrt", "cpu"]), default="tensorrt", show_default=True, help="int8: the Q/DQ flavour.")
@click.option("--keep-fp32", default="", help="fp16: what the base policy keeps in fp32 already (op types, modules, roles, cells).")
@click.option("--data-max", type=float, default=None, help="fp16: the range pass threshold of the base policy (default fp16 max / 8).")
@gate_options()
@click.option("--recipe", "recipe_path", type=click.Path(dir_okay=False),
              help="Where to write the recipe (default BUNDLE/reports/precision-recipe-<precision>.json).")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="ONNX Runtime threads.")
@json_option("the report")
def command(bundle, precision, data, samples, eval_data, eval_limit, method, smooth, smooth_alpha, target, keep_fp32, data_max,
            gate, recipe_path, threads, as_json):
    """Find which blocks and roles of BUNDLE must stay in higher precision, and write the recipe.

    Each cell (one block's qkv, attention matmuls, attn-proj, mlp-fc1, mlp-fc2; the patch
    embedding; the head), each block and each role is put ALONE in the reduced precision and
    scored against fp32 on labelled data with the gate of `vitdeploy check`; its damage is the share
    of the gate's tolerance it uses (1 = fails alone). Then the smallest set of cells to keep in
    higher precision is searched (bisection over the ranking, then unneeded cells dropped) and
    written as a recipe that `calibrate --recipe FILE` (int8) or `convert --recipe FILE` /
    `convert --keep-fp32 ...` (fp16) reproduce. A table, a JSON report and a PNG of the damage per
    block and role go to BUNDLE/reports/.

    \b
    Example:
      vitdeploy debug-precision digits-bundle --precision int8
      vitdeploy calibrate digits-bundle --recipe digits-bundle/reports/precision-recipe-int8.json
      vitdeploy debug-precision vits-bundle --precision int8 --data ./calib --eval-data ./val --smooth layernorm
      vitdeploy debug-precision vits-bundle --precision fp16 --data ./calib --eval-data ./val
      vitdeploy convert vits-bundle --precision fp16 --recipe vits-bundle/reports/precision-recipe-fp16.json
    """
    from vitdeploy.calibration.debug_precision import DebugOptions, debug_precision
    from vitdeploy.console import get_console

    options = DebugOptions(precision=precision, data=data, samples=samples, eval_data=eval_data, eval_limit=eval_limit, method=method,
                           smoothing=smooth, smooth_alpha=smooth_alpha, target=target, keep_fp32=tuple(split_csv(keep_fp32)),
                           data_max=data_max, gate=gate,
                           threads=threads, recipe_path=recipe_path)
    report = debug_precision(bundle, options)  # progress lines: its module's logger
    if as_json:
        echo_json(report)
        return
    from vitdeploy.calibration.precision_report import render_table

    get_console().print(render_table(report))
    result = report["result"]
    kept = ", ".join(report["kept"]) or "nothing (the whole graph passes)"
    agreement = "n/a" if result.get("top1_agreement") is None else f"{result['top1_agreement']:.2%}"  # n/a: an embedding model
    click.echo(f"keep in higher precision: {kept}; {precision} layers {result['reduced_layers']}, agreement "
               f"{agreement}, cosine p1 {result['cosine_p1']:.4f}: {'passes' if result['passed'] else 'fails'}")
    click.echo(f"recipe: {report['recipe_file']} (report {report['json']}, plot {report['png']})")
    if precision != "fp16":  # the calibrated precisions take the recipe file itself
        click.echo(f"reproduce: vitdeploy calibrate {bundle} --precision {precision} --recipe {report['recipe_file']}"
                   + (f" --data {data}" if data else "") + (f" --eval-data {eval_data}" if eval_data else ""))
    else:
        from vitdeploy.calibration.recipe_file import fp16_keep, read_recipe

        items = ",".join(fp16_keep(read_recipe(report["recipe_file"], "fp16")))
        click.echo(f"reproduce: vitdeploy convert {bundle} --precision fp16" + (f" --keep-fp32 {items}" if items else "")
                   + (f" --data {data}" if data else "") + (f" --eval-data {eval_data}" if eval_data else ""))
