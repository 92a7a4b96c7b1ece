"""`vitdeploy triton-repo`: the config parses as Triton's own ModelConfig protobuf, for both backends."""

from __future__ import annotations

import hashlib
import json

import pytest
from click.testing import CliRunner

from synthetic_bundle import LABELS, fake_engine, make_bundle
from vitdeploy.cli import main
from vitdeploy.errors import UserError
from vitdeploy.triton import TritonOptions, write_triton_repo

# tritonclient[grpc] is a dev dependency (pyproject): its model_config_pb2 is Triton's schema.
model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
text_format = pytest.importorskip("google.protobuf.text_format")


def parse(model_dir):
    """Strict parse: a field or enum Triton does not know raises ParseError."""
    return text_format.Parse((model_dir / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def bundle(tmp_path):
    return make_bundle(tmp_path / "quadrants", fp16=True)


def test_onnxruntime_repository(bundle, tmp_path):
    out = tmp_path / "models"
    result = CliRunner().invoke(main, ["triton-repo", str(bundle.root), str(out), "--dynamic-batching", "--instances", "2", "--max-batch", "16"])
    assert result.exit_code == 0, result.output
    model = out / "quadrants"
    cfg = parse(model)
    assert cfg.name == "quadrants" and cfg.platform == "onnxruntime_onnx" and cfg.default_model_filename == "model.onnx"
    assert cfg.max_batch_size == 16
    (image,) = cfg.input
    assert image.name == "images" and image.data_type == model_config_pb2.TYPE_UINT8 and list(image.dims) == [16, 16, 3]
    outputs = {o.name: o for o in cfg.output}
    assert set(outputs) == {"logits", "probs"}
    assert all(o.data_type == model_config_pb2.TYPE_FP32 and list(o.dims) == [len(LABELS)] for o in outputs.values())
    assert outputs["probs"].label_filename == "labels.txt" and not outputs["logits"].label_filename
    assert cfg.HasField("dynamic_batching") and cfg.dynamic_batching.max_queue_delay_microseconds == 100
    (group,) = cfg.instance_group
    assert group.count == 2 and group.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
    # the files Triton loads; the best graph for GPU instances is the fp16 one
    assert (model / "labels.txt").read_text().splitlines() == LABELS
    assert sha(model / "1" / "model.onnx") == sha(bundle.artifact_path("fp16"))
    provenance = json.loads((model / "vitdeploy.json").read_text())
    assert provenance["precision"] == "fp16" and provenance["graph_sha256"] == bundle.artifact_record("fp16")["sha256"]


def test_cpu_instances_dynamic_sizes_and_no_batching(tmp_path):
    dyn = make_bundle(tmp_path / "dyn", mode="dynamic")
    model = write_triton_repo(dyn, tmp_path / "m", TritonOptions(kind="cpu", name="vit-dyn"))
    cfg = parse(model)
    assert model.name == "vit-dyn" and cfg.name == "vit-dyn"
    assert list(cfg.input[0].dims) == [-1, -1, 3]
    assert cfg.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    assert not cfg.HasField("dynamic_batching")
    resize = make_bundle(tmp_path / "rs", in_graph_resize=True)
    cfg = parse(write_triton_repo(resize, tmp_path / "m", TritonOptions(max_batch=0, precision="fp32")))
    assert cfg.max_batch_size == 0 and list(cfg.input[0].dims) == [-1, -1, -1, 3]  # batch axis included
    assert list(cfg.output[1].dims) == [-1, len(LABELS)]
    floats = make_bundle(tmp_path / "fl", float_input=True)
    cfg = parse(write_triton_repo(floats, tmp_path / "m", TritonOptions()))
    assert cfg.input[0].data_type == model_config_pb2.TYPE_FP32 and list(cfg.input[0].dims) == [3, 16, 16]


def test_tensorrt_repository(bundle, tmp_path):
    fake_engine(bundle, "orin-trt10.3.0-fp16", "fp16", batch=(1, 8, 32))
    model = write_triton_repo(bundle, tmp_path / "m", TritonOptions(backend="tensorrt", dynamic_batching=True))
    cfg = parse(model)
    assert cfg.platform == "tensorrt_plan" and cfg.default_model_filename == "model.plan"
    assert cfg.max_batch_size == 32 and list(cfg.input[0].dims) == [16, 16, 3]
    assert cfg.output[1].label_filename == "labels.txt"
    assert sha(model / "1" / "model.plan") == sha(bundle.root / "engines" / "orin-trt10.3.0-fp16" / "model.plan")
    text = (model / "config.pbtxt").read_text()
    assert "TensorRT 10.3.0 for Orin (compute capability 8.7)" in text
    assert json.loads((model / "vitdeploy.json").read_text())["engine"] == "orin-trt10.3.0-fp16"

    with pytest.raises(UserError, match=r"exceeds engine .*\(batch up to 32\)"):
        write_triton_repo(bundle, tmp_path / "m", TritonOptions(backend="tensorrt", max_batch=64))
    with pytest.raises(UserError, match="GPU only"):
        write_triton_repo(bundle, tmp_path / "m", TritonOptions(backend="tensorrt", kind="cpu"))
    fake_engine(bundle, "h200-trt10.3.0-fp16", "fp16", gpu="NVIDIA H200", cc="9.0")
    with pytest.raises(UserError, match="several fp16 engines"):
        write_triton_repo(bundle, tmp_path / "m", TritonOptions(backend="tensorrt"))
    cfg = parse(write_triton_repo(bundle, tmp_path / "m", TritonOptions(backend="tensorrt", engine="h200-trt10.3.0-fp16", max_batch=8)))
    assert cfg.max_batch_size == 8


def test_bad_requests_leave_the_previous_repository_intact(bundle, tmp_path):
    out = tmp_path / "m"
    model = write_triton_repo(bundle, out, TritonOptions())
    before = (model / "config.pbtxt").read_text()
    runner = CliRunner()
    for args, what in [
        (["--backend", "tensorrt"], "no TensorRT engine"),
        (["--precision", "int8"], "no int8 graph"),
        (["--name", "../escape"], "model name"),
        (["--max-batch", "0", "--dynamic-batching"], "dynamic batching needs"),
    ]:
        result = runner.invoke(main, ["triton-repo", str(bundle.root), str(out), *args])
        assert result.exit_code == 1 and what in result.output and "Traceback" not in result.output, result.output
    assert (model / "config.pbtxt").read_text() == before
    assert sorted(p.name for p in out.iterdir()) == ["quadrants"]  # no staging leftovers


def test_triton_repo_help_has_an_example():
    result = CliRunner().invoke(main, ["triton-repo", "--help"])
    assert result.exit_code == 0 and "Example:" in result.output and "tritonserver --model-repository" in result.output


def test_digits_bundle_repository_for_both_backends(digits_bundle, copy_bundle, tmp_path):
    """Acceptance: the real exported model gives a valid ModelConfig for ONNX Runtime and TensorRT."""
    from vitdeploy.bundle import Bundle

    ort = parse(write_triton_repo(digits_bundle, tmp_path / "ort", TritonOptions(dynamic_batching=True)))
    assert ort.platform == "onnxruntime_onnx" and list(ort.input[0].dims) == [32, 32, 3]
    assert [list(o.dims) for o in ort.output] == [[10], [10]]
    bundle = Bundle.open(copy_bundle(digits_bundle))
    fake_engine(bundle, "orin-trt10.3.0-fp32", "fp32", batch=(1, 8, 32), hw=32)  # engines are built on GPUs
    trt = parse(write_triton_repo(bundle, tmp_path / "trt", TritonOptions(backend="tensorrt", dynamic_batching=True)))
    assert trt.platform == "tensorrt_plan" and trt.max_batch_size == 32 and list(trt.input[0].dims) == [32, 32, 3]
    assert (tmp_path / "trt" / bundle.name / "labels.txt").read_text().split() == [str(k) for k in range(10)]


def test_a_model_folder_vitdeploy_did_not_write_is_refused_whole(bundle, tmp_path):
    """OUT/<model> is replaced whole: another version folder, a stranger's model of that name, a bundle
    given as OUT or a file as OUT are refused in one line and left byte for byte."""
    runner = CliRunner()
    out = tmp_path / "models"
    model = write_triton_repo(bundle, out, TritonOptions())
    (model / "2").mkdir()
    (model / "2" / "model.onnx").write_bytes(b"their version 2")
    foreign_model = out / "other"
    foreign_model.mkdir()
    (foreign_model / "config.pbtxt").write_text('name: "other"\n')
    a_file = tmp_path / "file.txt"
    a_file.write_text("keep me")
    for args, what in [
        ([str(out)], "holds 2, which vitdeploy triton-repo did not write"),
        ([str(out), "--name", "other"], "did not write"),  # no provenance: someone else's model
        ([str(bundle.root)], "is a vitdeploy bundle, not a model repository"),
        ([str(bundle.root), "--name", "reports"], "is a vitdeploy bundle"),
        ([str(a_file)], "is a file"),
    ]:
        result = runner.invoke(main, ["triton-repo", str(bundle.root), *args])
        assert result.exit_code == 1 and what in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert (model / "2" / "model.onnx").read_bytes() == b"their version 2"
    assert (foreign_model / "config.pbtxt").read_text() == 'name: "other"\n' and a_file.read_text() == "keep me"
    # a repository triton-repo wrote is rewritten in place
    (model / "2" / "model.onnx").unlink()
    (model / "2").rmdir()
    result = runner.invoke(main, ["triton-repo", str(bundle.root), str(out), "--max-batch", "4"])
    assert result.exit_code == 0, result.output
    assert parse(model).max_batch_size == 4
    # a repository folder inside the bundle is a repository like any other
    for _ in range(2):
        result = runner.invoke(main, ["triton-repo", str(bundle.root), str(bundle.root / "triton")])
        assert result.exit_code == 0, result.output
