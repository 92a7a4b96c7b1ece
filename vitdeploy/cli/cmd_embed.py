"""`vitdeploy embed`: image features (the embedding, or the patch grid) from a bundle, to a .npy file."""

from __future__ import annotations

import click

from .common import command, echo_json, warn_random_weights
from .options import json_option, precision_option


@command("embed")
@click.argument("bundle", type=click.Path(path_type=str))
@click.argument("images", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False, path_type=str),
              help="The .npy file to write: [N, d] embeddings, or [N, d, G_h, G_w] with --patch-grid (written atomically).")
@click.option("--patch-grid", "patch_grid", is_flag=True, help="Write the patch grid instead of the pooled embedding.")
@click.option("--normalize", is_flag=True, help="L2-normalise the embeddings (a graph exported with --normalize-embedding already is).")
@precision_option("Which graph/engine to run; best: the lowest-precision engine built for this GPU, fp32 on CPU.")
@click.option("--backend", type=click.Choice(["auto", "tensorrt", "onnxruntime"]), default="auto", show_default=True,
              help="auto: a TensorRT engine whose fingerprint matches this device, else ONNX Runtime.")
@click.option("--resolution", default=None, help="HxW for a dynamic-resolution bundle (default: the manifest's).")
@click.option("--strict", is_flag=True, help="Stop at the first file that cannot be read (default: name it, embed the rest, exit 1).")
@click.option("--skip-unreadable", is_flag=True, help="Leave out files that cannot be read (named, no row in the output) and exit 0.")
@json_option("what was written (shape, rows, backend)")
def command(bundle: str, images: tuple[str, ...], output: str, patch_grid: bool, normalize: bool, precision: str, backend: str,
            resolution: str | None, strict: bool, skip_unreadable: bool, as_json: bool) -> None:
    """Embed IMAGES (files, folders, or one uint8 [N,H,W,3] .npy) with BUNDLE into a .npy array.

    Row i of the array belongs to the i-th image (folders expand to their sorted image files); the
    row names go to OUTPUT with .txt instead of .npy. A file that cannot be read is named and has
    no row; the others are embedded and written, and the exit code is 1 (--skip-unreadable: 0;
    --strict: stop at the first, write nothing), as `predict` and `evaluate` do. The bundle must be exported with the output
    asked for (`vitdeploy export --outputs ...,embedding,patch_grid`; a model without a head has
    both by default).

    \b
    Example:
      vitdeploy export -o feat --outputs logits,probs,embedding,patch_grid
      vitdeploy embed feat photos/ -o features.npy
      vitdeploy embed feat frame.png -o grid.npy --patch-grid
    """
    import numpy as np

    warn_random_weights(bundle)
    from ..errors import UsageError, UserError
    from ..fileio import atomic_path, atomic_write_text
    from ..runtime.classifier import BACKENDS, embed_files
    from ..spec import parse_resolution

    if not output.endswith(".npy"):
        raise UsageError(f"-o {output}: the features are written as a .npy array; give a name ending in .npy")
    if strict and skip_unreadable:
        raise UsageError("--strict stops at an unreadable file and --skip-unreadable leaves it out; give one of them")
    if patch_grid and normalize:
        raise UsageError("--normalize applies to embeddings; the patch grid is written as the graph returns it")
    prefer = BACKENDS if backend == "auto" else (backend,)
    size = parse_resolution(resolution) if resolution else None
    feats, names, about = embed_files(bundle, images, patch_grid=patch_grid, normalize=normalize, precision=precision,
                                      prefer=prefer, size=size, strict=strict)
    with atomic_path(output, suffix=".npy") as tmp:
        with open(tmp, "wb") as fh:
            np.save(fh, feats.astype(np.float32), allow_pickle=False)
    rows = output[: -len(".npy")] + ".txt"
    atomic_write_text(rows, "".join(f"{n}\n" for n in names))
    what = "patch grid" if patch_grid else "embedding"
    summary = {"output": output, "rows_file": rows, "what": what, "shape": list(feats.shape), **about}
    unreadable = about["unreadable"]
    if as_json:
        echo_json(summary)
    else:
        for item in unreadable:
            click.echo(f"{item['file']}: not embedded: {item['reason']}", err=True)
        click.echo(f"wrote {output}: {what} {list(feats.shape)} float32 for {len(names)} image(s) "
                   f"({about['backend']} {about['precision']} on {about['device']}); row names in {rows}")
    if unreadable and not skip_unreadable:
        raise UserError(f"{len(unreadable)} of {len(unreadable) + len(names)} images could not be read (first: {unreadable[0]['file']}); "
                        "the others were embedded and written; --skip-unreadable leaves them out, --strict stops at the first")
