"""`vitdeploy serve`: the bundle behind a Triton Inference Server (HTTP, gRPC, metrics, dynamic batching)."""

from __future__ import annotations

import click

from .common import command, warn_random_weights
from .options import precision_option


@command("serve")
@click.argument("bundle", type=click.Path(path_type=str))
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the HTTP, gRPC and metrics endpoints bind (0.0.0.0: all interfaces).")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True, help="HTTP/REST port (KServe v2 protocol).")
@click.option("--grpc-port", type=click.IntRange(1, 65535), default=8001, show_default=True, help="gRPC port.")
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=8002, show_default=True, help="Prometheus metrics port (/metrics).")
@click.option("--max-batch", type=click.IntRange(min=1), default=32, show_default=True, help="Triton max_batch_size: most images one execution gets (an engine's profile caps it).")
@click.option("--dynamic-batching/--no-dynamic-batching", default=True, show_default=True, help="Let Triton group concurrent requests into one execution.")
@click.option("--max-queue-delay-us", type=click.IntRange(min=0), default=500, show_default=True, help="Dynamic batching: longest wait for a fuller batch.")
@click.option("--instances", type=click.IntRange(min=1), default=1, show_default=True, help="Model instances (each its own engine context / ORT session).")
@click.option(
    "--backend",
    type=click.Choice(["auto", "tensorrt", "onnxruntime"]),
    default="auto",
    show_default=True,
    help="auto: a TensorRT engine whose fingerprint matches this device, else ONNX Runtime (as `predict`).",
)
@precision_option("Which graph/engine to serve (as `predict`).")
@click.option("--name", default=None, help="Model name (default: the bundle's, as `triton-repo` names it).")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="ONNX Runtime intra-op threads per instance (default: ORT's).")
@click.option("--drain-timeout", "drain_timeout_s", type=click.IntRange(min=0), default=30, show_default=True, help="On SIGTERM/SIGINT: seconds to let accepted requests finish.")
@click.option(
    "--serve-python",
    default=None,
    envvar="VITDEPLOY_SERVE_PYTHON",
    help="Python of the serve environment (PyTriton, numpy<2). Default: this Python if it has PyTriton, else the checkout's .venv-serve.",
)
def command(bundle: str, serve_python: str | None, **options) -> None:
    """Serve BUNDLE with NVIDIA Triton Inference Server until SIGTERM or Ctrl-C.

    The model runs on the same runtime as `predict` (a matching TensorRT engine, else ONNX
    Runtime), with the input and outputs named and typed exactly as `triton-repo` writes them, so
    one client works against this server and a production Triton loading the generated
    repository. Triton itself provides /v2/health/live, /v2/health/ready, the KServe v2 HTTP and
    gRPC APIs and Prometheus metrics. SIGTERM drains: accepted requests finish, new ones get an
    error response, then the server exits.

    Triton runs from the serve environment (PyTriton bundles tritonserver; it needs numpy < 2
    and a distribution-built Python): create it once with `make serve-env`.

    \b
    Example:
      make serve-env                                   # once: .venv-serve with PyTriton
      vitdeploy serve bundle --max-batch 32 --max-queue-delay-us 500
      curl localhost:8000/v2/health/ready && curl -s localhost:8002/metrics | grep nv_inference
      python examples/python/triton_client.py --bundle bundle digit.png
    """
    warn_random_weights(bundle)
    from ..serve.launcher import launch
    from ..serve.options import ServeOptions

    launch(ServeOptions(bundle=bundle, **options), serve_python=serve_python)
