"""`vitdeploy predict`: classify image files with a bundle (TensorRT engine or ONNX Runtime)."""

from __future__ import annotations

import click

from ..errors import UserError
from .common import command, echo_json, warn_random_weights
from .options import json_option, precision_option
from ..remote.cli import on_device


@command("predict")
@on_device(inputs=("images",))  # --on HOST: run on a device over ssh (vitdeploy/remote)
@click.argument("bundle", type=click.Path(path_type=str))
@click.argument("images", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("--top-k", "top_k", type=click.IntRange(min=1), default=5, show_default=True, help="Classes to show per image.")
@json_option(help='Print [{"image": ..., "top": [{"label": ..., "prob": ...}]}].')
@precision_option("Which graph/engine to run; best: the lowest-precision engine built for this GPU, fp32 on CPU.")
@click.option(
    "--backend",
    type=click.Choice(["auto", "tensorrt", "onnxruntime"]),
    default="auto",
    show_default=True,
    help="auto: a TensorRT engine whose fingerprint matches this device, else ONNX Runtime.",
)
@click.option("--resolution", default=None, help="HxW for a dynamic-resolution bundle (default: the manifest's).")
@click.option("--strict", is_flag=True, help="Stop at the first file that cannot be read (default: name it, classify the rest, exit 1).")
def command(bundle: str, images: tuple[str, ...], top_k: int, as_json: bool, precision: str, backend: str, resolution: str | None,
            strict: bool) -> None:
    """Classify IMAGES (files or folders) with BUNDLE.

    Images are decoded with Pillow (EXIF orientation applied; grayscale, RGBA, palette and CMYK
    converted to RGB) and resized by the rule in the bundle's manifest; the graph does the rest.

    \b
    Example:
      vitdeploy predict bundle cat.jpg dog.png
      vitdeploy predict bundle photos/ --top-k 3 --json
      vitdeploy predict bundle cat.jpg --backend onnxruntime --precision fp32
    """
    warn_random_weights(bundle)
    from ..runtime.classifier import BACKENDS, predict_files
    from ..spec import parse_resolution

    prefer = BACKENDS if backend == "auto" else (backend,)
    size = parse_resolution(resolution) if resolution else None
    results, about = predict_files(bundle, images, top_k=top_k, precision=precision, prefer=prefer, size=size, strict=strict)
    failed = [item for item in results if "error" in item]
    if as_json:
        echo_json(results)
    else:
        click.echo(f"# {about['backend']} {about['precision']} on {about['device']}, input {about['input_size'][0]}x{about['input_size'][1]}", err=True)
        for item in results:  # one line per image: its top-k, or why it has none
            if "error" in item:
                click.echo(f"{item['image']}: not classified: {item['error']}")
                continue
            tops = ", ".join(f"{t['label']} {t['prob']:.4f}" for t in item["top"])
            click.echo(f"{item['image']}: {tops}")
    if failed:
        raise UserError(f"{len(failed)} of {len(results)} images could not be read (first: {failed[0]['image']}); "
                        "the others were classified; --strict stops at the first")
