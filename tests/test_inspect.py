"""`vitdeploy inspect`: the metadata bound into a bundle and into its bare ONNX file."""

from __future__ import annotations

import json

import onnx
from click.testing import CliRunner

from vitdeploy.bundle import METADATA_KEY
from vitdeploy.cli import main


def test_inspect_bundle_and_bare_onnx(digits_bundle):
    result = CliRunner().invoke(main, ["inspect", str(digits_bundle.root), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    meta = report["metadata"]
    assert meta["source"]["kind"] == "builtin" and len(meta["source"]["weights_sha256"]) == 64
    assert meta["spec"]["patch_size"] == [4, 4] and meta["spec"]["num_prefix_tokens"] == 1
    assert meta["labels"] == [str(i) for i in range(10)]
    assert meta["preprocessing"]["scale"] == "1/255" and meta["preprocessing"]["input"] == "uint8-nhwc"
    assert meta["resolution"]["pos_embed_interpolation"]["method"] == "bicubic"
    assert report["costs"]["seq_len"] == 65

    # the ONNX file alone carries the same core (self-describing without manifest.json)
    onnx_path = digits_bundle.artifact_path("fp32")
    props = {p.key: p.value for p in onnx.load(str(onnx_path)).metadata_props}
    core = json.loads(props[METADATA_KEY])
    assert core["spec"] == digits_bundle.manifest["spec"] and core["preprocessing"]["mean"] == meta["preprocessing"]["mean"]
    bare = CliRunner().invoke(main, ["inspect", str(onnx_path)])
    assert bare.exit_code == 0, bare.output
    for needle in ("builtin:digits", "patch 4x4", "1/255", "labels", "GMACs"):
        assert needle in bare.output


def test_inspect_rejects_foreign_files(tmp_path):
    plain = tmp_path / "plain.onnx"
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "g",
                                   [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                                   [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    onnx.save(onnx.helper.make_model(graph), str(plain))
    result = CliRunner().invoke(main, ["inspect", str(plain)])
    assert result.exit_code == 1 and "carries no vitdeploy metadata" in result.output
    (tmp_path / "junk.onnx").write_bytes(b"not onnx")
    junk = CliRunner().invoke(main, ["inspect", str(tmp_path / "junk.onnx")])
    assert junk.exit_code == 1 and "not a readable ONNX file" in junk.output
    empty = CliRunner().invoke(main, ["inspect", str(tmp_path)])
    assert empty.exit_code == 1 and "not a vitdeploy bundle" in empty.output
