"""`vitdeploy calibrate`."""

from __future__ import annotations

from typing import Any

import click

from vitdeploy import precisions

from .common import command, echo_json, graph_memory_line, split_csv
from .options import gate_options, json_option


@command("calibrate")
@click.argument("bundle", type=click.Path(exists=True))
@click.option("--data", default=None,
              help="Calibration images: a folder (any sizes, resized by the model's rule), a uint8 [N,H,W,3] .npy at the input size, a .npz (its images), "
                   "or digits:train (the default for the builtin digits bundle).")
@click.option("--precision", "precision", type=click.Choice(precisions.calibrated()), default=precisions.calibrated()[0], show_default=True,
              help="The graph to calibrate: int8 (model.int8.onnx) or fp8 (model.fp8.onnx, E4M3; methods max, percentile).")
@click.option("--fp8-attention", type=click.Choice(["fp8", "float"]), default="fp8", show_default=True,
              help="FP8 only: Q/DQ on Q, K, V and the softmax output (fp8: TensorRT's fused FP8 attention) or none (float: fp16 attention).")
@click.option("--method", type=click.Choice(["entropy", "minmax", "percentile", "max"]), default=None,
              help="How activation ranges are chosen from the calibration data. Default: entropy, and when held-out data "
                   "is below the gate, the next recipe (percentile, minmax, then fewer layers in INT8) until one passes.")
@click.option("--samples", type=click.IntRange(min=1), default=512, show_default=True,
              help="Calibration images to use (a seeded random subset when the source holds more).")
@click.option("--exclude-op-types", default="", help="Op types kept in float, comma-separated (of MatMul, Gemm, Conv).")
@click.option("--exclude-blocks", default="", help="PyTorch modules kept in float, comma-separated, e.g. blocks.0,blocks.11,head.")
@click.option("--exclude-roles", default="",
              help="ViT parts kept in float: attention-matmuls, mlp-fc2, patch-embed, head (comma-separated).")
@click.option("--sweep", is_flag=True, help="Try methods x exclusion sets, score each on held-out labelled data, keep the best in the gate.")
@click.option("--sweep-methods", default="entropy,minmax,percentile", show_default=True,
              help="Calibration methods the sweep tries, comma-separated.")
@click.option("--target", type=click.Choice(["tensorrt", "cpu"]), default="tensorrt", show_default=True,
              help="tensorrt: symmetric S8S8 Q/DQ; cpu: U8S8 with 7-bit weights, which ORT's CPU int8 kernels run without saturating.")
@click.option("--eval-data", default=None,
              help="Labelled held-out images for the accuracy gate: DIR/<class>/<image>, a .npz with images + labels, or digits:test (the default for the digits bundle).")
@click.option("--eval-limit", type=click.IntRange(min=1), default=None, help="Use at most this many held-out images (a seeded random subset).")
@gate_options()
@click.option("--smooth", "smooth", type=click.Choice(["auto", "none", "layernorm", "all"]), default="auto", show_default=True,
              help="SmoothQuant-style migration of activation outliers into the weights before calibration: layernorm folds it into "
                   "the LayerNorms' gamma/beta (no new node), all also puts a per-channel Mul before attn.proj and mlp.fc2. "
                   "auto: the ladder and --sweep try none, layernorm, all (before excluding layers); --method alone uses none.")
@click.option("--smooth-alpha", type=click.FloatRange(0.0, 1.0), default=0.5, show_default=True,
              help="Migration strength alpha of the smoothing (SmoothQuant's s_j = max|X_j|^alpha / max|W_j|^(1-alpha)).")
@click.option("--recipe", "recipe_file", type=click.Path(dir_okay=False),
              help="A recipe file from `vitdeploy debug-precision --precision int8`: exactly that method, target, smoothing and "
                   "layers kept in float (no ladder), gated as usual.")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="ONNX Runtime threads for calibration and scoring.")
@json_option("the record (int8 or fp8)")
def command(bundle, precision, fp8_attention, data, method, samples, exclude_op_types, exclude_blocks, exclude_roles, sweep, sweep_methods, target,
            eval_data, eval_limit, gate, smooth, smooth_alpha, recipe_file, threads, as_json):
    """Write BUNDLE/model.int8.onnx: explicit Q/DQ on the linear layers, calibrated and measured.

    Q/DQ goes on the inputs of MatMul/Gemm/Conv (symmetric int8 activations, per-channel int8
    weights); LayerNorm, Softmax, GELU and the residual adds stay float. Activation outliers (a few
    LayerNorm channels tens of times larger, as in CLIP, DeiT, DINOv2) are migrated into the weights
    by a smoothing pass verified function-preserving in fp32 (--smooth). The graph is scored on
    held-out images in reference semantics (fake-quant, what TensorRT computes) and as this CPU
    executes it, and is written only if it passes the gate of `vitdeploy check` (accuracy drop,
    top-1 agreement, worst logit cosine). The manifest records the data hash and count, method,
    exclusions, target, the recipes tried and the accuracies.

    \b
    Example:
      vitdeploy calibrate digits-bundle
      vitdeploy calibrate digits-bundle --sweep
      vitdeploy calibrate vits-bundle --data ./calib --eval-data ./val --method percentile --exclude-roles head
      vitdeploy calibrate vits-bundle --data calib.npy --target cpu
      vitdeploy calibrate vits-bundle --data ./calib --eval-data ./val --smooth layernorm --smooth-alpha 0.6 --method entropy
      vitdeploy calibrate vits-bundle --data ./calib --eval-data ./val --recipe vits-bundle/reports/precision-recipe-int8.json
    """
    if precision != "int8":
        return _calibrate_fp8(bundle, fp8_attention, data, method, samples, eval_data, eval_limit, gate,
                              threads, as_json, given=[flag for flag, value in (("--exclude-op-types", exclude_op_types), ("--exclude-blocks", exclude_blocks),
                                                                               ("--exclude-roles", exclude_roles), ("--sweep", sweep),
                                                                               ("--smooth", smooth != "auto"),
                                                                               ("--target", target != "tensorrt")) if value],
                              recipe_file=recipe_file)
    if fp8_attention != "fp8":
        from vitdeploy.errors import UserError

        raise UserError("--fp8-attention applies to --precision fp8 only")
    from vitdeploy.calibration.api import CalibrateOptions, calibrate_bundle
    from vitdeploy.calibration.exclusions import Exclusions
    from vitdeploy.console import get_console

    recipe = None
    if recipe_file is not None:
        from vitdeploy.calibration.recipe_file import int8_recipe, read_recipe
        from vitdeploy.errors import UserError

        given = [flag for flag, value in (("--method", method), ("--exclude-op-types", exclude_op_types), ("--exclude-blocks", exclude_blocks),
                                         ("--exclude-roles", exclude_roles), ("--sweep", sweep)) if value]
        if smooth != "auto":
            given.append("--smooth")
        if given:
            raise UserError(f"--recipe sets the method, smoothing and the layers kept in float; drop {', '.join(given)}")
        recipe = int8_recipe(read_recipe(recipe_file, "int8"))
        target = recipe.target
    options = CalibrateOptions(
        data=data, samples=samples, method=method, target=target, eval_data=eval_data, eval_limit=eval_limit, sweep=sweep,
        sweep_methods=tuple(split_csv(sweep_methods)),
        exclusions=Exclusions(tuple(split_csv(exclude_op_types)), tuple(split_csv(exclude_blocks)), tuple(split_csv(exclude_roles))),
        gate=gate, threads=threads,
        smoothing=smooth, smooth_alpha=smooth_alpha, recipe=recipe,
    )
    err = get_console(stderr=True)
    with _CalibrationProgress(err, enabled=not as_json) as progress:  # progress lines: calibration's loggers
        record = calibrate_bundle(bundle, options, progress=progress,
                                  show_table=None if as_json else get_console().print)
    if as_json:
        echo_json(record)
        return
    click.echo(_summary(record))
    click.echo(graph_memory_line(record))


def _calibrate_fp8(bundle, attention, data, method, samples, eval_data, eval_limit, gate, threads, as_json, given,
                   recipe_file=None):
    from vitdeploy.calibration.fp8_api import Fp8Options, calibrate_fp8_bundle
    from vitdeploy.errors import UserError

    if given:
        raise UserError(f"{', '.join(given)}: INT8 only; FP8 takes --method max|percentile and --fp8-attention")
    keep: tuple[str, ...] = ()
    if recipe_file is not None:  # what `debug-precision --precision fp8` found: method, attention, the sites kept in float
        from vitdeploy.calibration.recipe_file import read_recipe

        if method:
            raise UserError("--recipe sets the method; drop --method")
        recipe = read_recipe(recipe_file, "fp8")
        method, attention = recipe.get("method"), recipe.get("attention", attention)
        keep = tuple((recipe.get("keep_float") or {}).get("nodes") or ())
    options = Fp8Options(data=data, samples=samples, method=method, attention=attention, eval_data=eval_data, eval_limit=eval_limit, keep=keep,
                         gate=gate, threads=threads)
    record = calibrate_fp8_bundle(bundle, options)
    if as_json:
        echo_json(record)
        return
    ev = (record.get("evaluation") or {}).get("reference") or {}
    lin = record["linear_layers"]
    click.echo(f"model.fp8.onnx: E4M3 Q/DQ on {lin['fp8']}/{lin['total']} linear layers and {record['attention']['fp8']}/"
               f"{record['attention']['matmuls']} attention matmuls ({record['method']})"
               + (f"; accuracy {ev['accuracy']:.2%}, top-1 agreement {ev['top1_agreement']:.2%}, cosine p1 {ev['cosine_p1']:.4f}"
                  if ev.get("accuracy") is not None else "")
               + (f"; embedding cosine p1 {ev['cosine_p1']:.4f}" if ev.get("scored") == "embedding" else ""))
    click.echo(graph_memory_line(record))


class _CalibrationProgress:
    """A rich progress bar per calibration pass (a sweep runs one per method)."""

    def __init__(self, console: Any, enabled: bool):
        self.enabled = enabled
        self.console = console
        self.bar = None
        self.task = None
        self.last = 0

    def __enter__(self) -> "_CalibrationProgress":
        if self.enabled:
            from rich.progress import Progress

            from ..console import lazy_progress

            self.bar = lazy_progress(self.console, *Progress.get_default_columns())
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            return
        if self.task is None or done <= self.last:
            self.task = self.bar.add_task("calibrating", total=total)
        self.bar.update(self.task, completed=done)
        self.last = done


def _summary(record: dict[str, Any]) -> str:
    cal = record["calibration"]
    lines = [f"wrote model.int8.onnx ({record['target']} target, {record['method']}, "
             f"{record['placement']['quantized_layers']}/{record['placement']['linear_layers']} linear layers in int8; "
             f"calibrated on {cal['count']} images of {cal['source']})"]
    ev = record.get("evaluation")
    if ev is None:
        lines.append("accuracy not measured: no labelled held-out data (pass --eval-data DIR/<class>/<image>, or run `vitdeploy check`)")
    else:
        def acc(v: Any) -> str:
            return "n/a" if v is None else f"{v:.2%}"

        if ev["reference"].get("scored") == "embedding":  # an embedding model: no classes, its embedding is gated
            lines.append(f"{ev['data']} ({ev['count']} images), embedding against fp32: int8 reference (fake-quant) cosine p1 "
                         f"{ev['reference']['cosine_p1']:.4f} (worst {ev['reference']['cosine_min']:.4f}), nearest-neighbour agreement "
                         f"{acc(ev['reference'].get('neighbour_agreement'))}; int8 on this CPU cosine p1 {ev['this_cpu']['cosine_p1']:.4f}, "
                         f"nearest-neighbour agreement {acc(ev['this_cpu'].get('neighbour_agreement'))}")
        else:
            lines.append(f"{ev['data']} ({ev['count']} images): fp32 {acc(ev['fp32_accuracy'])}; "
                         f"int8 reference (fake-quant) {acc(ev['reference']['accuracy'])}, agreement {acc(ev['reference']['top1_agreement'])}, "
                         f"worst cosine {ev['reference']['cosine_min']:.4f}; "
                         f"int8 on this CPU {acc(ev['this_cpu']['accuracy'])}, agreement {acc(ev['this_cpu']['top1_agreement'])}, "
                         f"worst cosine {ev['this_cpu']['cosine_min']:.4f}")
    variable = cal.get("variable_size")
    if variable:  # a two-input (images, valid_hw) bundle
        lines.append(f"variable size: calibrated on (images, valid_hw) pairs at {variable['distinct_sizes']} sizes "
                     f"({variable['smallest'][0]}x{variable['smallest'][1]} to {variable['largest'][0]}x{variable['largest'][1]}); "
                     "scored as rows of padded mixed-size batches vs each image alone through fp32; the valid_hw mask path "
                     "has no Q/DQ; edge valid_hw rows give finite outputs")
    smoothing = record.get("smoothing")
    if smoothing:
        lines.append(f"smoothing (alpha {smoothing['alpha']:g}, {smoothing['scope']}): {smoothing['layers_touched']} linear layers, "
                     f"{smoothing['new_nodes']} Mul nodes added, fp32 unchanged to {smoothing['verification']['max_rel_diff']:.1e} relative")
    selection = record.get("selection") or {}
    if selection.get("mode") in ("sweep", "ladder") and len(selection["candidates"]) > 1:
        chosen = selection["chosen"]
        smooth_text = "none" if not chosen.get("smoothing") else f"{chosen['smoothing']['scope']} a={chosen['smoothing']['alpha']:g}"
        lines.append(f"{selection['mode']} chose {chosen['method']} / exclusions {chosen['exclusions']} / smoothing {smooth_text} "
                     f"of {len(selection['candidates'])} recipes ({selection['rule']})")
    return "\n".join(lines)
