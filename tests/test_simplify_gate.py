"""What gates onnxslim's graph: the export's verification against PyTorch when it runs (no separate
identity check), bit-identical ORT outputs on a probe when it does not (--no-check); a simplified
graph that fails verification falls back to the exporter's graph only when onnxslim is to blame."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
from onnx import numpy_helper  # noqa: E402

from vitdeploy.errors import CheckFailed  # noqa: E402


@pytest.fixture
def exporter_graph(digits_bundle: Any) -> Any:
    """The digits graph as a fresh export hands it to the simplifier (a verified, correct graph)."""
    return onnx.load(str(digits_bundle.artifact_path("fp32")))


def _head_bias_shifted(proto: Any) -> Any:
    """A copy whose classifier bias is shifted for one class: every image's logits change."""
    out = copy.deepcopy(proto)
    bias = next(t for t in out.graph.initializer if t.dims == [10] and "head" in t.name)
    value = numpy_helper.to_array(bias).copy()
    value[3] += 5.0
    bias.CopyFrom(numpy_helper.from_array(value, bias.name))
    return out


def _export(monkeypatch: pytest.MonkeyPatch, out: Any, graph: Any, slim: Any | None, **options: Any) -> tuple[Any, list[str], list[str]]:
    """Export builtin:digits with the exporter's graph and onnxslim's result replaced; returns
    (bundle, log lines, the graphs verification saw as 'slim'/'exporter')."""
    import vitdeploy.exporters.api as api
    import vitdeploy.exporters.onnx_export as onnx_export
    from vitdeploy.exporters import ExportOptions

    monkeypatch.setattr(api, "export_graph", lambda *_a, **_k: (copy.deepcopy(graph), 0.1))
    if slim is not None:
        def fake_slim(model: Any) -> tuple[Any, dict[str, Any]]:
            return copy.deepcopy(slim), {"simplifier": "onnxslim", "version": "test", "applied": True,
                                         "nodes_before": len(model.graph.node), "nodes_after": len(slim.graph.node), "slim_s": 0.0}

        monkeypatch.setattr(api, "run_onnxslim", fake_slim)
        monkeypatch.setattr(onnx_export, "run_onnxslim", fake_slim)  # the --no-check path's identity gate
    verified: list[str] = []
    real_verify = api.verify_export

    def spy(bundle: Any, *args: Any, **kwargs: Any) -> Any:
        verified.append("slim" if bundle.manifest["graph"].get("simplify_applied") else "exporter")
        return real_verify(bundle, *args, **kwargs)

    monkeypatch.setattr(api, "verify_export", spy)
    lines: list[str] = []
    bundle = api.export("builtin:digits", out, ExportOptions(check_images=8, **options), log=lines.append)
    return bundle, lines, verified


def test_a_verified_export_gates_onnxslim_by_the_verification_alone(digits_bundle):
    graph = digits_bundle.manifest["graph"]
    assert graph["simplify_applied"] is True
    assert graph["simplify_gate"] == "the export's verification against PyTorch"
    assert graph["simplify_nodes_after"] <= graph["simplify_nodes_before"]
    timing = digits_bundle.manifest["records"]["export"]["simplify"]
    assert "slim_s" in timing and "identity_check_s" not in timing  # no second pair of ORT sessions
    assert digits_bundle.manifest["records"]["export_check"]["passed"] is True


@pytest.mark.slow  # two verifications of one export (about 6 s of CPU)
def test_a_simplified_graph_that_fails_verification_falls_back_to_the_exporters(tmp_path, monkeypatch, exporter_graph):
    bundle, lines, verified = _export(monkeypatch, tmp_path / "b", exporter_graph, _head_bias_shifted(exporter_graph))
    assert verified == ["slim", "exporter"]
    assert any("verifying the exporter's graph instead" in line for line in lines)
    graph = bundle.manifest["graph"]
    assert graph["simplify_applied"] is False
    assert "failed verification" in graph["simplify_reason"]
    assert bundle.manifest["records"]["export_check"]["passed"] is True
    written = onnx.load(str(bundle.artifact_path("fp32")))
    head = next(t for t in written.graph.initializer if t.dims == [10] and "head" in t.name)
    original = next(t for t in exporter_graph.graph.initializer if t.name == head.name)
    np.testing.assert_array_equal(numpy_helper.to_array(head), numpy_helper.to_array(original))


def test_an_export_that_is_itself_wrong_fails_once_without_blaming_onnxslim(tmp_path, monkeypatch, exporter_graph):
    wrong = _head_bias_shifted(exporter_graph)
    with pytest.raises(CheckFailed, match="does not match PyTorch"):
        _export(monkeypatch, tmp_path / "b", wrong, wrong)  # onnxslim changed nothing
    assert not (tmp_path / "b").exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # no staging folder left behind


def test_without_verification_onnxslim_needs_bit_identical_outputs(tmp_path, monkeypatch, exporter_graph):
    bundle, lines, verified = _export(monkeypatch, tmp_path / "b", exporter_graph, _head_bias_shifted(exporter_graph), check=False)
    assert verified == []
    graph = bundle.manifest["graph"]
    assert graph["simplify_applied"] is False and graph["simplify_reason"].startswith("outputs changed")
    assert "identity_check_s" in bundle.manifest["records"]["export"]["simplify"]

    bundle, lines, _ = _export(monkeypatch, tmp_path / "c", exporter_graph, exporter_graph, check=False)
    graph = bundle.manifest["graph"]
    assert graph["simplify_applied"] is True
    assert graph["simplify_gate"] == "ORT outputs bit-identical to the exporter's graph on a probe"
    assert any("simplified with onnxslim (outputs identical)" in line for line in lines)
