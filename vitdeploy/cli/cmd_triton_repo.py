"""`vitdeploy triton-repo`: a Triton Inference Server model repository for a bundle."""

from __future__ import annotations

import click

from .common import command, warn_random_weights
from .options import precision_option


@command("triton-repo")
@click.argument("bundle", type=click.Path(path_type=str))
@click.argument("out", type=click.Path(path_type=str))
@click.option("--backend", type=click.Choice(["onnxruntime", "tensorrt"]), default="onnxruntime", show_default=True, help="Serve the ONNX graph or a TensorRT engine.")
@click.option("--max-batch", type=click.IntRange(min=0), default=32, show_default=True, help="Triton max_batch_size (0: no batching).")
@click.option("--dynamic-batching", is_flag=True, help="Let Triton group single requests into batches.")
@click.option("--queue-delay-us", type=click.IntRange(min=0), default=100, show_default=True, help="Dynamic batching: longest wait for a fuller batch.")
@click.option("--instances", type=click.IntRange(min=1), default=1, show_default=True, help="Model instances (instance_group count).")
@click.option("--kind", type=click.Choice(["gpu", "cpu"]), default="gpu", show_default=True, help="Where the instances run.")
@click.option("--name", default=None, help="Model name in the repository (default: the bundle's name).")
@precision_option("Which graph/engine to serve.")
@click.option("--engine", "engine", default=None, help="tensorrt: which engines/<TARGET> to serve (when the bundle has several).")
def command(bundle: str, out: str, backend: str, max_batch: int, dynamic_batching: bool, queue_delay_us: int, instances: int, kind: str, name: str | None, precision: str, engine: str | None) -> None:
    """Write OUT/<model>/ (config.pbtxt, labels, 1/model.onnx or 1/model.plan) for BUNDLE.

    The input is the bundle's raw uint8 image tensor; the probs output carries the labels file, so
    a client asking for class_count gets "prob:index:label" strings. The folder is staged and
    swapped in whole.

    \b
    Example:
      vitdeploy triton-repo bundle models --dynamic-batching
      vitdeploy triton-repo bundle models --backend tensorrt --max-batch 8 --instances 2
      tritonserver --model-repository=models
    """
    warn_random_weights(bundle)
    from ..triton import TritonOptions, describe_repo, write_triton_repo

    options = TritonOptions(
        backend=backend,
        max_batch=max_batch,
        dynamic_batching=dynamic_batching,
        queue_delay_us=queue_delay_us,
        instances=instances,
        kind=kind,
        name=name,
        precision=precision,
        engine=engine,
    )
    model_dir = write_triton_repo(bundle, out, options)
    summary = describe_repo(model_dir)
    click.echo(f"wrote {model_dir} ({summary['provenance']['backend']}, {summary['provenance']['precision']})")
    for path in summary["files"]:
        click.echo(f"  {path}")
