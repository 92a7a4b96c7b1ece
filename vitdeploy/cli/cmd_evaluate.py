"""`vitdeploy evaluate`."""

from __future__ import annotations

import click

from ..errors import UsageError
from ..spec import parse_resolution
from .common import command, echo_json, split_csv, warn_random_weights
from .options import json_option, precision_list_option

_FILLS = ("mean", "gray", "black", "white", "border")


@command("evaluate")
@click.argument("bundle", type=click.Path(exists=True))
@click.argument("images", nargs=-1)
@click.option("--data", default=None, help="Labelled images: digits:test, DIR/<class>/<image> (folders named after labels), "
              "or a .npz with images uint8 [N,H,W,3] + labels (default: the bundled model's test split).")
@precision_list_option("Graphs to score, comma-separated (default: every graph in the bundle).")
@click.option("--suite", default="all", show_default=True,
              help="Shift transforms: all, none, or comma-separated names (crop, scale, jpeg, occlusion, occlusion-aligned, "
                   "background-solid, background-noise, background-texture, brightness, contrast).")
@click.option("--ladder", type=click.Choice(["default", "fine"]), default="default", show_default=True,
              help="Severities per transform: default (2-4 each, mild to severe: 29 conditions with clean) or fine "
                   "(3-6 each, the steps between added: 42 conditions).")
@click.option("--severity", "severities", multiple=True, metavar="NAME=V1,V2",
              help="Severities of one transform instead of its ladder, e.g. jpeg=90,50,10 (repeatable).")
@click.option("--resolutions", default=None, help="Also score clean accuracy at these sizes (N or HxW, comma-separated).")
@click.option("--max-drop", type=float, default=2.0, show_default=True,
              help="Flag, in points: accuracy below the native size's (resolutions); agreement with the reference below clean (shift).")
@click.option("--occlusion-fill", type=click.Choice(_FILLS), default=None,
              help="Occluder colour: the preprocessing mean (zero input), gray 128, black, white, or the image's border median "
                   "[default: mean for the suite, border (erase to background) for --occlusion-map].")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of every random transform.")
@click.option("--batch", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--limit", type=click.IntRange(min=1), default=None, help="A seeded random subset of this many images.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Threads per scorer (ONNX Runtime, PyTorch); with fewer than the CPUs, scorers run side by side "
                   "(--threads 1 on 2 cores: two at once) [default: the CPUs shared out over the scorers, at least one each].")
@click.option("--no-reference", is_flag=True, help="Do not rebuild the PyTorch reference (graphs only).")
@click.option("--skip-unreadable", is_flag=True, help="Leave out images that cannot be decoded (counted and named in the report) "
              "instead of stopping.")
@click.option("--occlusion-map", "occlusion_map", is_flag=True,
              help="Instead of the suite: occlusion sensitivity maps for IMAGES (files, or one source such as digits:test).")
@click.option("--occlusion-patch", type=click.IntRange(min=1), default=None, help="Occlusion map square side, px [default: 2 patches].")
@click.option("--occlusion-stride", type=click.IntRange(min=1), default=None, help="Occlusion map stride, px [default: 1 patch].")
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write the reports here instead of the bundle's reports/ folder.")
@click.option("--no-plot", is_flag=True, help="Skip the PNG plots.")
@json_option(help="Print the JSON report instead of the summary.")
def command(bundle, images, data, precision, suite, ladder, severities, resolutions, max_drop, occlusion_fill, seed, batch, limit, threads,
            no_reference, skip_unreadable, occlusion_map, occlusion_patch, occlusion_stride, out_dir, no_plot, as_json):
    """Is the deployed model fit for the conditions it will meet? Accuracy of every graph in BUNDLE
    (fp32, fp16, int8 in the execution it targets; TensorRT engines where they run) and of the
    PyTorch reference, on labelled data, clean and under a declared shift suite (crop, scale, JPEG,
    occlusion, background change, brightness/contrast) and other resolutions.

    Every transform is seeded; its rule and severities are written into reports/evaluate.json. Per
    condition: accuracy with a 95% Wilson interval, drop vs clean, top-1 agreement with the reference
    under the same perturbation, per class and per object size. Also writes evaluate.csv,
    evaluate_strata.csv, evaluate.png (accuracy vs severity) and evaluate_classes.png.

    With --occlusion-map: slide a square over each image and record the drop of the target-class
    probability computed by the deployed graph (reports/occlusion/: .npy maps, PNG overlays, JSON).

    \b
    Example:
      vitdeploy evaluate digits-bundle
      vitdeploy evaluate digits-bundle --suite jpeg,occlusion --severity jpeg=50,10 --resolutions 24,48
      vitdeploy evaluate vits-bundle --data ./val --precision fp32,int8 --limit 500 --json
      vitdeploy evaluate digits-bundle --occlusion-map digits:test --limit 16
      vitdeploy evaluate digits-bundle --occlusion-map photo1.png photo2.png --occlusion-patch 8
    """
    warn_random_weights(bundle)
    from ..console import get_console
    from ..evaluate.report import BarProgress

    if images and not occlusion_map:
        raise UsageError(f"unexpected argument(s) {' '.join(images[:3])}: image arguments are for --occlusion-map; "
                        "labelled data for the suite goes in --data")
    progress_console = get_console(stderr=True)
    if occlusion_map:
        from ..evaluate.occlusion_map import OcclusionOptions, run_occlusion_map

        options = OcclusionOptions(patch=occlusion_patch, stride=occlusion_stride, fill=occlusion_fill or "border",
                                   precision=(split_csv(precision) or ["fp32"])[0], limit=limit, batch=max(batch, 1), threads=threads,
                                   skip_unreadable=skip_unreadable)
        inputs = list(images) or ([data] if data else [])
        with BarProgress(progress_console) as bar:
            report = run_occlusion_map(bundle, inputs, out_dir, options, progress=bar)
        if as_json:
            echo_json(report)
            return
        share = report["foreground_above_background"]
        click.echo(f"occlusion maps of {report['count']} images ({report['precision']} graph): {report['rule']}")
        if share is not None:
            click.echo(f"mean sensitivity on the foreground exceeds the background's on {share:.1%} of "
                       f"{report['images_with_separable_background']} images with a separable background")
        click.echo(f"written: {report['out_dir']}/occlusion.npy, occlusion_signed.npy, occlusion_targets.npy, occlusion.png, occlusion.json")
        return

    from ..evaluate.report import render_summary
    from ..evaluate.run import EvaluateOptions, run_evaluate

    options = EvaluateOptions(
        data=data, precisions=split_csv(precision) or None, suite=suite, ladder=ladder, severities=tuple(severities),
        resolutions=[parse_resolution(r) for r in split_csv(resolutions)] or None, max_drop_pt=max_drop, seed=seed, batch=batch,
        limit=limit, threads=threads, reference=not no_reference, occlusion_fill=occlusion_fill or "mean", skip_unreadable=skip_unreadable,
    )
    with BarProgress(progress_console) as bar:
        result = run_evaluate(bundle, options, progress=bar)  # progress lines: its module's logger
    report = result.report
    paths = _write(bundle, report, out_dir, not no_plot)
    if as_json:
        echo_json(report)
        return
    render_summary(report, get_console())
    for kind, path in paths.items():
        click.echo(f"{kind}: {path}")


def _write(bundle_path, report, out_dir, plot):
    from pathlib import Path

    from ..bundle import Bundle
    from ..evaluate.report import write_reports
    from ..fileio import signals_deferred

    bundle = Bundle.open(bundle_path)
    target = Path(out_dir) if out_dir is not None else bundle.reports_dir()
    if out_dir is None and bundle.bare_onnx is not None:
        target = bundle.bare_onnx.parent / "reports"
    with signals_deferred():  # the reports and the manifest's record of them land together
        paths = write_reports(report, target, plot=plot)
        if out_dir is None and bundle.bare_onnx is None:
            bundle.set_record("evaluate", {
                "created": report["created"], "report": str(paths["json"].relative_to(bundle.root)),
                "data": report["data"]["source"], "graph_sha256": bundle.artifact_sha256("fp32"),
                "clean_accuracy": {s: r["clean"]["accuracy"] for s, r in report["results"].items()},
                "flags": len(report["flags"]),
            })
    return paths
