"""`vitdeploy serve`: a real Triton Inference Server (PyTriton's tritonserver) on the digits bundle.

One server for the whole module (started through the CLI, on free 127.0.0.1 ports); the last test
stops it with SIGTERM. The serve environment (.venv-serve, `make serve-env`, a dependency of
`make test`) must exist: without it these tests fail with the command that creates it, they do
not skip, since CI is where they have to run.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

# The dev extra's tritonclient[grpc,http]: imported, not importorskip'ed (CI must run these tests).
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException
from waiting import HANG_GUARD_S, wait_until

from vitdeploy.cli import main

MAX_BATCH = 16


def _require_serve_env() -> None:
    from vitdeploy.errors import VitDeployError
    from vitdeploy.serve.launcher import check_serve_python, resolve_serve_python

    try:
        check_serve_python(*resolve_serve_python())
    except VitDeployError as exc:
        pytest.fail(f"the serve environment is missing, so `vitdeploy serve` cannot be tested: {exc}", pytrace=False)


@pytest.fixture(scope="module")
def digits_split():
    from vitdeploy.builtin import BUILTIN_MODELS

    return BUILTIN_MODELS["digits"].load_split("test")


@pytest.fixture(scope="module")
def server(digits_bundle, tmp_path_factory):
    from vitdeploy.serve.process import ServeProcess

    _require_serve_env()
    log = tmp_path_factory.mktemp("serve") / "server.log"
    # a long --drain-timeout: the SIGTERM test's late request must find tritonserver still stopping
    proc = ServeProcess(digits_bundle.root, ["--max-batch", str(MAX_BATCH), "--max-queue-delay-us", "2000", "--threads", "1",
                                             "--drain-timeout", str(int(HANG_GUARD_S))], log_path=log)
    proc.start()
    yield proc
    proc.stop()


def _http(server, **kw):
    return httpclient.InferenceServerClient(server.http_url, network_timeout=60, **kw)


def _infer_http(client, name, images, dtype="UINT8"):
    inp = httpclient.InferInput("images", list(images.shape), dtype)
    inp.set_data_from_numpy(images)
    return client.infer(name, [inp])


def _infer_grpc(client, name, images):
    inp = grpcclient.InferInput("images", list(images.shape), "UINT8")
    inp.set_data_from_numpy(images)
    return client.infer(name, [inp])


def assert_still_serving(server, images) -> None:
    """The next well-formed request after a fault is answered, over both protocols."""
    with _http(server) as client:
        probs = _infer_http(client, server.model_name, images[:2]).as_numpy("probs")
    assert probs.shape == (2, 10) and np.allclose(probs.sum(1), 1, atol=1e-5)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert _infer_grpc(client, server.model_name, images[:1]).as_numpy("probs").shape == (1, 10)


def _server_tree(pid: int) -> list[int]:
    """pid and every descendant (tritonserver, the Python-backend stub, PyTriton's store process)."""
    tree, frontier = [pid], [pid]
    while frontier:
        parent = frontier.pop()
        try:
            tasks = list(Path(f"/proc/{parent}/task").iterdir())
        except FileNotFoundError:  # exited meanwhile
            continue
        for task in tasks:
            try:
                children = (task / "children").read_text().split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            for child in map(int, children):
                if child not in tree:
                    tree.append(child)
                    frontier.append(child)
    return tree


def _resources(pid: int) -> dict:
    tree = _server_tree(pid)
    fds = sum(len(os.listdir(f"/proc/{p}/fd")) for p in tree)
    threads = sum(len(os.listdir(f"/proc/{p}/task")) for p in tree)
    return {"processes": len(tree), "fds": fds, "threads": threads, "shm": sorted(_shm_mapped(tree))}


def _shm_mapped(tree: list[int]) -> set[str]:
    """Shared-memory regions the server's processes have mapped (PyTriton's tensor blocks, the
    Python backend's region): read from /proc, so other programs' /dev/shm files do not count."""
    names = set()
    for p in tree:
        try:
            maps = Path(f"/proc/{p}/maps").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        names.update(line.split("/dev/shm/", 1)[1].split(" (deleted)")[0].strip() for line in maps.splitlines() if "/dev/shm/" in line)
    return names


# -- the server Triton exposes --------------------------------------------------------------------
@pytest.mark.slow
def test_health_metrics_and_config_match_the_generated_repository(server, digits_bundle, tmp_path):
    from vitdeploy.triton import TritonOptions, write_triton_repo

    with _http(server) as client:
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(server.model_name)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        served = client.get_model_config(server.model_name).config
    repo = write_triton_repo(digits_bundle, tmp_path / "repo", TritonOptions(kind="cpu", max_batch=MAX_BATCH))
    written = text_format.Parse((repo / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    # Same name, same tensors: a client of the generated repository works against this server.
    assert served.name == written.name == server.model_name
    assert served.max_batch_size == written.max_batch_size == MAX_BATCH
    for kind in ("input", "output"):
        assert [(t.name, t.data_type, list(t.dims)) for t in getattr(served, kind)] == [
            (t.name, t.data_type, list(t.dims)) for t in getattr(written, kind)
        ]
    assert served.HasField("dynamic_batching") and served.dynamic_batching.max_queue_delay_microseconds == 2000
    conn = http.client.HTTPConnection("127.0.0.1", server.metrics_port, timeout=10)
    conn.request("GET", "/metrics")
    metrics = conn.getresponse().read().decode()
    assert f'nv_inference_request_success{{model="{server.model_name}"' in metrics


def test_same_top1_as_predict_over_http_and_grpc(server, digits_bundle, digits_split, tmp_path):
    """Acceptance: the 360 test images, as files through `predict` and as pixels through Triton."""
    from vitdeploy.runtime.classifier import predict_files

    images, labels = digits_split
    files = []
    for i, img in enumerate(images):
        files.append(tmp_path / f"{i:03d}.png")
        Image.fromarray(img).save(files[-1])
    results, _ = predict_files(digits_bundle, files, top_k=1, prefer=("onnxruntime",))
    label_names = digits_bundle.labels
    expected = np.array([label_names.index(r["top"][0]["label"]) for r in results])
    assert len(expected) == 360 and (expected == labels).mean() > 0.9

    # HTTP: client-side batches; gRPC: one image per request, 16 at a time (the dynamic batcher's case)
    with _http(server) as client:
        http_probs = np.concatenate([_infer_http(client, server.model_name, images[i : i + MAX_BATCH]).as_numpy("probs") for i in range(0, 360, MAX_BATCH)])
    with grpcclient.InferenceServerClient(server.grpc_url) as client, ThreadPoolExecutor(16) as pool:
        grpc_probs = np.concatenate(list(pool.map(lambda i: _infer_grpc(client, server.model_name, images[i : i + 1]).as_numpy("probs"), range(360))))
    assert (http_probs.argmax(1) == expected).all()
    assert (grpc_probs.argmax(1) == expected).all()
    np.testing.assert_allclose(http_probs, grpc_probs, atol=1e-5)


CLIENTS, PER_CLIENT = 8, 40  # 320 single-image requests; the batcher can merge at most CLIENTS of them


def _statistics_headers(server) -> dict:
    """PyTriton guards Triton's statistics API with an access token it generates and hands to
    tritonserver on its command line (`--http-restricted-api APIS:triton-access-token=TOKEN`)."""
    for pid in _server_tree(server.proc.pid):
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        for flag, value in zip(args, args[1:]):
            if flag == "--http-restricted-api" and "statistics" in value.split(":", 1)[0]:
                key, token = value.split(":", 1)[1].split("=", 1)
                return {key: token}
    raise AssertionError("no tritonserver with a restricted statistics API in the server's process tree")


def _small_batch_stats(client, server, headers) -> tuple:
    """(images, executions) over the executions of at most CLIENTS images, from Triton's statistics
    API: exact, kept per executed batch size (Prometheus' counters are not per batch size)."""
    (stats,) = client.get_inference_statistics(server.model_name, headers=headers)["model_stats"]
    sizes = [(b["batch_size"], b["compute_infer"]["count"]) for b in stats.get("batch_stats", []) if b["batch_size"] <= CLIENTS]
    return sum(size * count for size, count in sizes), sum(count for _, count in sizes)


def test_concurrent_load_has_no_failures_and_batches(server, digits_split):
    """Concurrent single-image clients: every request answered, Triton counted each exactly once,
    and the dynamic batcher merged them.

    Counted, not timed: the server reports an execution's statistics after its responses are sent,
    so an earlier test's last execution may land after this test starts. One model instance runs
    executions in order, so once a lone MAX_BATCH request (the fence) has been answered, every
    execution before it has been counted; the fence itself lands in the batch size MAX_BATCH, which
    this test's requests (at most CLIENTS in flight) never reach, so the baseline is exact."""
    images, _ = digits_split
    assert CLIENTS < MAX_BATCH
    headers = _statistics_headers(server)
    with _http(server) as client:
        assert _infer_http(client, server.model_name, images[:MAX_BATCH]).as_numpy("probs").shape == (MAX_BATCH, 10)  # the fence
        images0, executions0 = _small_batch_stats(client, server, headers)
    failures = []

    def client_loop(k):
        with _http(server) as client:
            for j in range(PER_CLIENT):
                try:
                    probs = _infer_http(client, server.model_name, images[(k * PER_CLIENT + j) % 360][None]).as_numpy("probs")
                    assert probs.shape == (1, 10)
                except Exception as exc:  # noqa: BLE001 - every failure is counted and reported
                    failures.append(repr(exc))

    threads = [threading.Thread(target=client_loop, args=(k,)) for k in range(CLIENTS)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert failures == []
    sent = CLIENTS * PER_CLIENT
    with _http(server) as client:
        # the last execution's statistics may trail its responses: wait for them (nothing else runs now)
        counted = wait_until(lambda: (lambda s: s if s[0] - images0 >= sent else None)(_small_batch_stats(client, server, headers)),
                             "Triton counting this test's inferences")
    inferences, executions = counted[0] - images0, counted[1] - executions0
    assert inferences == sent
    assert executions < inferences  # the dynamic batcher merged concurrent requests


def test_client_example_prints_top_k_with_the_bundles_labels(server, digits_bundle, digits_split, tmp_path):
    import sys

    from vitdeploy.runtime.classifier import predict_files

    images, _ = digits_split
    files = []
    for i in (0, 1, 2):
        files.append(str(tmp_path / f"digit{i}.png"))
        Image.fromarray(images[i]).resize((64, 64)).save(files[-1])  # another size: the client resizes by the manifest's rule
    expected, _ = predict_files(digits_bundle, files, top_k=2, prefer=("onnxruntime",))
    example = Path(__file__).resolve().parents[1] / "examples" / "python" / "triton_client.py"
    for protocol, url in (("http", server.http_url), ("grpc", server.grpc_url)):
        proc = subprocess.run(
            [sys.executable, str(example), "--bundle", str(digits_bundle.root), "--protocol", protocol, "--url", url, "--top-k", "2", *files],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.strip().splitlines()
        assert len(lines) == 3
        for line, item in zip(lines, expected):
            path, tops = line.split(": ")
            labels = [t.rsplit(" ", 1)[0] for t in tops.split(", ")]
            assert path == item["image"] and labels == [t["label"] for t in item["top"]]


def test_a_taken_port_is_one_clear_line(server, digits_bundle):
    """A second server on the first one's HTTP port must not talk to the first one (PyTriton would)."""
    from vitdeploy.serve.process import free_ports, vitdeploy_command

    grpc_port, metrics_port = free_ports(2)
    cmd = vitdeploy_command() + ["serve", str(digits_bundle.root), "--port", str(server.port), "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"error: --port {server.port} on 127.0.0.1 is not available (Address already in use); is another server running? choose another port"
    assert_still_serving(server, np.zeros((2, 32, 32, 3), np.uint8))


# -- faults: each gets an error response and the server answers the next request ------------------
def test_wrong_dtype_is_rejected(server, digits_split):
    images, _ = digits_split
    with _http(server) as client, pytest.raises(InferenceServerException, match="(?i)data-type|datatype|expects 'UINT8'"):
        _infer_http(client, server.model_name, images[:1].astype(np.float32), dtype="FP32")
    assert_still_serving(server, images)


def test_wrong_shape_is_rejected(server, digits_split):
    images, _ = digits_split
    with _http(server) as client, pytest.raises(InferenceServerException, match="(?i)shape"):
        _infer_http(client, server.model_name, np.zeros((1, 32, 33, 3), np.uint8))
    with grpcclient.InferenceServerClient(server.grpc_url) as client, pytest.raises(InferenceServerException, match="(?i)shape"):
        _infer_grpc(client, server.model_name, np.zeros((2, 32, 32), np.uint8))
    assert_still_serving(server, images)


def test_batch_above_max_is_rejected(server, digits_split):
    images, _ = digits_split
    with _http(server) as client, pytest.raises(InferenceServerException, match=f"batch-size must be <= {MAX_BATCH}"):
        _infer_http(client, server.model_name, images[: MAX_BATCH + 1])
    assert_still_serving(server, images)


def _raw_infer(server, body: bytes, header_len: int, content_length: int, close_early: bool = False):
    """POST an inference with a binary tensor, as tritonclient would, but with lengths we choose."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.putrequest("POST", f"/v2/models/{server.model_name}/infer")
    conn.putheader("Inference-Header-Content-Length", str(header_len))
    conn.putheader("Content-Type", "application/octet-stream")
    conn.putheader("Content-Length", str(content_length))
    conn.endheaders()
    conn.send(body)
    if close_early:  # the client goes away mid-body: there is nobody to answer
        conn.sock.shutdown(2)
        conn.close()
        return None
    reply = conn.getresponse()
    status, text = reply.status, reply.read().decode(errors="replace")
    conn.close()
    return status, text


def test_truncated_request_bytes_are_rejected(server, digits_split):
    images, _ = digits_split
    pixels = images[:1].tobytes()
    header = json.dumps(
        {"inputs": [{"name": "images", "shape": [1, 32, 32, 3], "datatype": "UINT8", "parameters": {"binary_data_size": len(pixels)}}]}
    ).encode()
    # 1) the body is complete as sent, but the tensor in it is cut short
    cut = header + pixels[: len(pixels) // 2]
    status, text = _raw_infer(server, cut, len(header), len(cut))
    assert status == 400 and text, text
    # 2) the JSON header itself is cut short
    status, text = _raw_infer(server, header[:40], 40, 40)
    assert status in (400, 500) and "parse" in json.loads(text)["error"], text  # Triton answers 500 here
    # 3) the client announces more bytes than it sends and hangs up
    _raw_infer(server, header + pixels[:100], len(header), len(header) + len(pixels), close_early=True)
    # a well-formed raw request on the same path works: the lengths, not the framing, were at fault
    whole = header + pixels
    status, text = _raw_infer(server, whole, len(header), len(whole))
    assert status == 200, text
    assert_still_serving(server, images)


def test_faults_leak_nothing(server, digits_split):
    """A hundred faulty requests of every kind leave the server's processes, fds, threads and shared
    memory where they were."""
    images, _ = digits_split
    pid = server.proc.pid
    pixels = images[:1].tobytes()
    header = json.dumps({"inputs": [{"name": "images", "shape": [1, 32, 32, 3], "datatype": "UINT8", "parameters": {"binary_data_size": len(pixels)}}]}).encode()

    def faults(rounds):
        with _http(server) as client:
            for _ in range(rounds):
                for bad, dtype in ((images[:1].astype(np.float32), "FP32"), (np.zeros((1, 31, 32, 3), np.uint8), "UINT8"), (images[: MAX_BATCH + 1], "UINT8")):
                    with pytest.raises(InferenceServerException):
                        _infer_http(client, server.model_name, bad, dtype=dtype)
                cut = header + pixels[:1000]
                assert _raw_infer(server, cut, len(header), len(cut))[0] == 400
                _raw_infer(server, header + pixels[:100], len(header), len(header) + len(pixels), close_early=True)
        assert_still_serving(server, images)

    seen = {}

    def settled() -> bool:
        """The connections the clients closed are reaped (the server does that in its own time)."""
        seen["now"] = now = _resources(pid)
        back = now["processes"] == before["processes"] and now["shm"] == before["shm"]
        return back and now["fds"] <= before["fds"] + 2 and now["threads"] <= before["threads"] + 2

    faults(2)  # warm every path once
    before = _resources(pid)  # may still count the warm-up's closing connections: that only loosens the bound
    faults(20)  # 100 faulty requests
    # a leak never settles: the hang guard then fails the test with the numbers
    wait_until(settled, lambda: f"the server's processes, fds, threads and shared memory returning to {before} (last seen: {seen.get('now')})")


# -- shutdown (last: it stops the module's server) -------------------------------------------------
def _metric(server, name: str) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", server.metrics_port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{") and server.model_name in line)


@pytest.mark.slow
def test_sigterm_drains_in_flight_rejects_new_and_exits_clean(server, digits_split):
    """Ordered by events, not sleeps. The server's Python process (which runs the model's batches) is
    paused with SIGSTOP while 16 full batches go out, so all of them are provably inside the server
    when SIGTERM comes (one handed to the model, 15 in Triton's queue: its pending gauge); then it
    continues, and every one must be answered in full. A request on a connection opened before the
    signal, sent once tritonserver has been told to stop, gets an error response (the module's server
    runs with a long --drain-timeout, so tritonserver is still there to give it, however slow this
    machine is). Pausing the backend stub instead would not do: Triton reports a stopped stub as
    unhealthy and fails its requests."""
    images, _ = digits_split
    proc = server.proc
    tree = _server_tree(proc.pid)
    shm_before = _shm_mapped(tree)
    assert shm_before  # PyTriton moves tensors through shared memory
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        workspace = client.get_model_config(server.model_name).config.parameters["workspace-path"].string_value
    assert Path(workspace).is_dir()
    assert len(tree) >= 3  # the CLI exec'd into the server, which runs tritonserver and a backend stub

    batch = np.repeat(images[:1], MAX_BATCH, axis=0)  # a full batch each: the batcher cannot merge them
    results, signalled = [], threading.Event()

    def in_flight():
        with _http(server) as client:
            try:
                shape = _infer_http(client, server.model_name, batch).as_numpy("probs").shape
                results.append(("ok", shape, signalled.is_set()))
            except Exception as exc:  # noqa: BLE001
                results.append(("error", repr(exc), signalled.is_set()))

    late = _http(server)
    late.is_server_live()  # an open connection, used only after SIGTERM
    threads = [threading.Thread(target=in_flight) for _ in range(16)]
    proc.send_signal(signal.SIGSTOP)
    try:
        [t.start() for t in threads]
        wait_until(lambda: _metric(server, "nv_inference_pending_request_count") == 15, "15 requests queued behind the paused model")
        proc.send_signal(signal.SIGTERM)  # held by the kernel until the process continues: it comes first
        signalled.set()
    finally:
        proc.send_signal(signal.SIGCONT)
    [t.join() for t in threads]
    # every request that was in the server when the signal came was answered in full: drained
    assert len(results) == 16 and all(r[0] == "ok" and r[1] == (MAX_BATCH, 10) and r[2] for r in results), results
    wait_until(lambda: "Signal (2) received" in server.log_path.read_text(errors="replace"), "tritonserver being told to stop")
    with pytest.raises(InferenceServerException):
        _infer_http(late, server.model_name, images[:1])  # a request during shutdown: an error response
    late.close()
    assert proc.wait(HANG_GUARD_S) == 0, server.log_tail()

    def alive() -> list:
        def running(p: int) -> bool:
            try:
                return "zombie" not in Path(f"/proc/{p}/status").read_text()
            except (FileNotFoundError, ProcessLookupError):
                return False

        return [p for p in tree if running(p)]

    # nothing left behind: no process of the tree, no shared-memory region, no workspace
    wait_until(lambda: not alive(), lambda: f"the server's processes exiting (left: {alive()})")
    left = {n for n in shm_before if (Path("/dev/shm") / n).exists()}
    assert not left, left  # the server's regions are unlinked
    assert not Path(workspace).exists(), workspace  # PyTriton's workspace (model store, sockets) removed
    assert "stopping (draining" in server.log_path.read_text()


# -- without a server ------------------------------------------------------------------------------
def test_missing_serve_environment_is_one_clear_line(digits_bundle, tmp_path):
    result = CliRunner().invoke(main, ["serve", str(digits_bundle.root), "--serve-python", str(tmp_path / "nope" / "python")])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "no serve environment" in lines[0] and "make serve-env" in lines[0]
    assert "Traceback" not in result.output


def test_a_python_without_pytriton_is_named(digits_bundle):
    import sys  # the main environment: by design it has no PyTriton (numpy 2, torch)

    result = CliRunner().invoke(main, ["serve", str(digits_bundle.root), "--serve-python", sys.executable])
    assert result.exit_code == 1 and "lacks pytriton" in result.output and "make serve-env" in result.output, result.output


def test_a_backend_that_cannot_run_the_bundle_is_one_line_from_the_server(digits_bundle):
    """Errors raised in the serve environment (after the exec) reach the user as one line too."""
    _require_serve_env()
    from vitdeploy.serve.process import free_ports, vitdeploy_command

    ports = [str(p) for p in free_ports(3)]
    cmd = vitdeploy_command() + ["serve", str(digits_bundle.root), "--backend", "tensorrt", "--port", ports[0], "--grpc-port", ports[1], "--metrics-port", ports[2]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [f"error: the bundle has no TensorRT engine (build one on this device with `vitdeploy build-engine {digits_bundle.root}`)"]


def test_options_round_trip_to_the_server_command_line():
    from vitdeploy.serve.options import ServeOptions

    opts = ServeOptions("b", port=9000, grpc_port=9001, metrics_port=9002, max_batch=8, dynamic_batching=False, instances=2, threads=1, name="m")
    assert ServeOptions.from_argv(opts.to_argv()) == opts
    with pytest.raises(Exception, match="must differ"):
        ServeOptions("b", port=9000, grpc_port=9000).validate()
