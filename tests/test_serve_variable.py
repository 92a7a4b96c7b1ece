"""`vitdeploy serve` on a variable-size bundle (issue 28): a real Triton server (PyTriton's tritonserver)
takes two-input requests (images in the 48x48 canvas + valid_hw) over HTTP and gRPC, batches them,
and answers what `vitdeploy predict` answers for the same files. Needs the serve environment, as
tests/test_serve.py does (it fails, not skips, without it)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from PIL import Image

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

pytestmark = pytest.mark.slow
SIZES = [(20, 36), (48, 48), (33, 17), (8, 40), (44, 12), (30, 30), (64, 20), (12, 12)]


@pytest.fixture(scope="module")
def variable_bundle(export_cached):
    return export_cached("builtin:digits", variable_size=True, canvas=(48, 48))


@pytest.fixture(scope="module")
def server(variable_bundle, tmp_path_factory):
    from vitdeploy.errors import VitDeployError
    from vitdeploy.serve.launcher import check_serve_python, resolve_serve_python
    from vitdeploy.serve.process import ServeProcess

    try:
        check_serve_python(*resolve_serve_python())
    except VitDeployError as exc:
        pytest.fail(f"the serve environment is missing, so `vitdeploy serve` cannot be tested: {exc}", pytrace=False)
    log = tmp_path_factory.mktemp("serve-variable") / "server.log"
    proc = ServeProcess(variable_bundle.root, ["--max-batch", "8", "--max-queue-delay-us", "2000", "--threads", "1"], log_path=log)
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """Digits from the test split at mixed sizes and aspect ratios (one larger than the canvas), as PNG files."""
    from vitdeploy.builtin.digits import load_digits_split

    images, _ = load_digits_split("test")
    root = tmp_path_factory.mktemp("variable-photos")
    files = []
    for i, (h, w) in enumerate(SIZES):
        files.append(root / f"digit{i}_{h}x{w}.png")
        Image.fromarray(images[i]).resize((w, h), Image.BILINEAR).save(files[-1])
    return files


def _two_inputs(module, images, valid):
    a = module.InferInput("images", list(images.shape), "UINT8")
    a.set_data_from_numpy(images)
    b = module.InferInput("valid_hw", list(valid.shape), "INT32")
    b.set_data_from_numpy(valid)
    return [a, b]


def test_two_input_requests_answer_what_predict_answers(server, variable_bundle, photos):
    from vitdeploy.contract import InputContract
    from vitdeploy.runtime.classifier import predict_files

    results, about = predict_files(variable_bundle, photos, top_k=10, prefer=("onnxruntime",))
    assert about["canvas"] == [48, 48] and about["policy"] == "fit-within"
    expected = np.array([[dict((t["label"], t["prob"]) for t in r["top"])[label] for label in variable_bundle.labels] for r in results])
    contract = InputContract.from_bundle(variable_bundle)
    feeds = contract.feeds([contract.prepare(str(p)) for p in photos])  # what a client does: fit, pad, valid sizes
    assert feeds["valid_hw"].tolist() != [[48, 48]] * len(photos)  # really mixed sizes

    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        config = client.get_model_config(server.model_name).config
        assert [(t.name, list(t.dims)) for t in config.input] == [("images", [48, 48, 3]), ("valid_hw", [2])]
        # one image per request, all at once: the dynamic batcher mixes sizes in one execution
        with ThreadPoolExecutor(8) as pool:
            grpc_probs = np.concatenate(list(pool.map(
                lambda i: client.infer(server.model_name, _two_inputs(grpcclient, feeds["images"][i:i + 1], feeds["valid_hw"][i:i + 1]))
                .as_numpy("probs"), range(len(photos)))))
    with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as client:
        http_probs = client.infer(server.model_name, _two_inputs(httpclient, feeds["images"], feeds["valid_hw"])).as_numpy("probs")
    for probs in (grpc_probs, http_probs):
        assert probs.shape == (len(photos), 10)
        np.testing.assert_allclose(probs, expected, atol=1e-5)
        assert (probs.argmax(1) == expected.argmax(1)).all()
    # a request without valid_hw is refused by Triton itself, and the server keeps serving
    with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as client:
        only = httpclient.InferInput("images", [1, 48, 48, 3], "UINT8")
        only.set_data_from_numpy(feeds["images"][:1])
        with pytest.raises(Exception, match="valid_hw"):
            client.infer(server.model_name, [only])
        again = client.infer(server.model_name, _two_inputs(httpclient, feeds["images"][:2], feeds["valid_hw"][:2])).as_numpy("probs")
    np.testing.assert_allclose(again, expected[:2], atol=1e-5)
