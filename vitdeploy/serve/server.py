"""The server process: ``python -m vitdeploy.serve.server BUNDLE [options]`` (in the serve environment).

`vitdeploy serve` execs this with the serve environment's Python. It loads the bundle's runtime,
binds it into a Triton Inference Server through PyTriton (which starts the tritonserver binary its
wheel bundles: HTTP/REST and gRPC in the KServe v2 protocol, health/readiness, Prometheus metrics,
the dynamic batcher) and serves until SIGTERM or SIGINT.

Shutdown drains: on the signal, tritonserver is asked to stop (PyTriton sends it SIGINT); it stops
admitting new inferences, lets the in-flight ones finish (up to --drain-timeout seconds) and only
then exits; the Python side, which executes those in-flight batches, is closed after it. PyTriton's
workspace and shared-memory regions are removed on the way out.
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
import threading
import time
from typing import List, Optional

from ..errors import DeviceError, MissingDependencyError, UserError, VitDeployError
from .options import ServeOptions

SERVE_ENV_HINT = (
    "create the serve environment with `make serve-env` (or `bash scripts/install_serve_env.sh`), "
    "or install 'vitdeploy[serve]' into a venv made from the system python3 and pass its python with --serve-python"
)


def _import_pytriton():
    try:
        from pytriton.decorators import batch  # noqa: F401  (import check of the whole package)
        from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
        from pytriton.triton import Triton, TritonConfig
    except ImportError as exc:
        raise MissingDependencyError(f"PyTriton (nvidia-pytriton) is needed by `vitdeploy serve` but {sys.executable} cannot import it ({exc}); {SERVE_ENV_HINT}") from None
    return DynamicBatcher, ModelConfig, Tensor, Triton, TritonConfig


def serve(opts: ServeOptions, ready_stream=sys.stderr) -> int:
    """Serve until SIGTERM/SIGINT; returns the exit status."""
    import numpy as np

    from .binding import BatchRunner, describe, load_classifiers, signature

    DynamicBatcher, ModelConfig, Tensor, Triton, TritonConfig = _import_pytriton()
    check_ports_free(opts)
    classifiers = load_classifiers(opts)
    sig = signature(classifiers[0], opts)

    stop = threading.Event()

    def on_signal(signum, _frame):  # only flags: the main thread does the stopping
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    config = TritonConfig(
        http_address=opts.host,
        http_port=opts.port,
        grpc_address=opts.host,
        grpc_port=opts.grpc_port,
        metrics_address=opts.host,
        metrics_port=opts.metrics_port,
        exit_timeout_secs=opts.drain_timeout_s,
        log_verbose=0,
    )
    batcher = DynamicBatcher(max_queue_delay_microseconds=opts.max_queue_delay_us) if opts.dynamic_batching else None
    model_config = ModelConfig(batching=True, max_batch_size=opts.max_batch, batcher=batcher)
    triton = Triton(config=config)
    try:
        triton.bind(
            model_name=sig.name,
            infer_func=[BatchRunner(clf, sig) for clf in classifiers],  # one per Triton instance
            inputs=[Tensor(name=t.name, dtype=np.dtype(t.dtype), shape=t.dims) for t in sig.inputs],
            outputs=[Tensor(name=t.name, dtype=np.dtype(t.dtype), shape=t.dims) for t in sig.outputs],
            config=model_config,
            strict=True,
        )
        try:
            triton.run()  # starts tritonserver, loads the model, waits until it is ready
        except Exception as exc:  # PyTriton raises its own types; the server log above says more
            raise ServerStartError(f"the Triton server did not start ({exc.__class__.__name__}: {exc}); see the tritonserver log above") from None
        print(describe(classifiers[0], sig, opts), file=ready_stream, flush=True)
        while not stop.wait(0.5):
            if not triton.is_alive():
                print("error: the Triton server or its model process exited unexpectedly", file=sys.stderr, flush=True)
                return 1
        print("vitdeploy serve: stopping (draining in-flight requests)", file=sys.stderr, flush=True)
        drain(triton, sig.name, opts)
        return 0
    finally:
        try:
            triton.stop()  # tritonserver drains and exits first, then the Python side closes
        except Exception as exc:  # noqa: BLE001 - exiting anyway; one line instead of a traceback
            print(f"vitdeploy serve: incomplete shutdown ({exc.__class__.__name__}: {exc})", file=sys.stderr, flush=True)
        for clf in classifiers:
            clf.close()


class ServerStartError(DeviceError):
    """tritonserver did not come up (its own log says why)."""


def check_ports_free(opts: ServeOptions) -> None:
    """Refuse ports already taken. Without this, PyTriton's client would find *another* server on
    the HTTP port and try to load this model into it."""
    for flag, port in (("--port", opts.port), ("--grpc-port", opts.grpc_port), ("--metrics-port", opts.metrics_port)):
        with socket.socket(socket.AF_INET6 if ":" in opts.host else socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: TIME_WAIT is no conflict
            try:
                probe.bind((opts.host, port))
            except OSError as exc:
                raise UserError(f"{flag} {port} on {opts.host} is not available ({exc.strerror}); is another server running? choose another port") from None


def drain(triton, name: str, opts: ServeOptions) -> None:
    """Unload the model through Triton's repository API before stopping the server.

    Triton's unload is the graceful path: from that moment the model admits no new request (a
    client gets an error response: the model has no available version) while the requests it has
    already accepted, queued ones included, run to completion; the call returns once they have.
    Stopping tritonserver directly instead tears the HTTP front end down under requests that are
    still executing in the Python backend (measured: some never complete and the exit timeout
    kills the server, leaving its backend process behind).
    """
    import tritonclient.http as httpclient
    from pytriton.client.auth import create_auth_headers

    headers = create_auth_headers(triton.get_access_token(), "http")  # PyTriton guards the repository API
    host = "127.0.0.1" if opts.host in ("0.0.0.0", "") else opts.host
    client = httpclient.InferenceServerClient(f"{host}:{opts.port}", network_timeout=max(opts.drain_timeout_s, 1) + 5.0)
    try:
        client.unload_model(name, headers=headers)
        deadline = time.monotonic() + opts.drain_timeout_s
        # The unload call returns once it has begun; the model is UNLOADING until its last accepted
        # request has been answered, then UNAVAILABLE.
        while _model_state(client, name, headers) in ("READY", "UNLOADING", "LOADING") and time.monotonic() < deadline:
            time.sleep(0.05)
    except Exception as exc:  # the server is going down regardless; say why the drain was cut short
        print(f"vitdeploy serve: could not drain through a model unload ({exc}); stopping the server directly", file=sys.stderr, flush=True)
    finally:
        client.close()


def _model_state(client, name: str, headers) -> str:
    for entry in client.get_model_repository_index(headers=headers):
        if entry.get("name") == name:
            return str(entry.get("state", ""))
    return ""


def main(argv: Optional[List[str]] = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    try:
        opts = ServeOptions.from_argv(sys.argv[1:] if argv is None else argv)
        return serve(opts)
    except VitDeployError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
