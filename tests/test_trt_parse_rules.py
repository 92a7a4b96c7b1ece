"""The ONNX parser facts per TensorRT line, the parse lint, and the lowering on small graphs (CPU, no TensorRT).

The facts are pinned here as they were read from onnx/onnx-tensorrt (8.5-GA, 8.6-GA, 10.1-GA,
10.15, 11.1); no parser runs in these tests.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from vitdeploy.engine.lint import lint_model
from vitdeploy.engine.lowering import LoweringError, lower_for
from vitdeploy.engine.parser_rules import RULES, rules_for


def test_key_facts_per_parser():
    r85, r86, r101, r103, r1013, r1014, r1016, r111 = (RULES[k] for k in ("8.5", "8.6", "10.1", "10.3", "10.13", "10.14", "10.16", "11.1"))
    assert [r.opset_max for r in (r85, r86, r101, r103, r1013, r1014, r1016, r111)] == [17, 17, 20, 20, 23, 24, 24, 24]
    assert [r.opset_min for r in (r85, r101)] == [7, 9]
    # the two ops of today's ViT graphs
    assert [("Gelu" in r.importers, "LayerNormalization" in r.importers) for r in (r85, r86, r101, r111)] == [
        (False, False), (False, True), (True, True), (True, True)]
    assert not r86.expands_functions and r101.expands_functions  # LocalFunctionImporter from 10.x
    assert {"GroupNormalization", "IsInf"} <= r86.importers - r85.importers
    # opset-23 Attention: 10.14 (operators.md at c7272770, Changelog 10.14); not at the 10.13 parser commit
    assert [r.attention for r in (r101, r103, r1013, r1014, r1016, r111)] == [False, False, False, True, True, True]
    assert {"RotaryEmbedding", "RMSNormalization", "TensorScatter"} <= r1016.importers - r1014.importers
    assert r1016.importers - r1014.importers == {"RotaryEmbedding", "RMSNormalization", "TensorScatter"}
    assert r111.importers - r1016.importers == {"Swish"}  # 11.0: Swish
    assert {"BlackmanWindow", "HammingWindow", "HannWindow", "STFT"} <= r1013.importers - r103.importers
    assert "DeformConv" in r101.importers and "DeformConv" not in rules_for("10.0").importers
    assert "GridSample" in r85.importers and "bicubic" in r85.gridsample_modes and "cubic" not in r86.gridsample_modes
    assert not r86.reduce_axes_input and r101.reduce_axes_input
    assert r85.qdq_zero_point_required and not r101.qdq_zero_point_required
    # Slice tensor axes from 10.3 (JetPack 6.1/6.2 already read them), Pad tensor axes from 10.4
    assert r101.slice_axes_constant and not r103.slice_axes_constant and not r111.slice_axes_constant
    assert r103.pad_axes_constant and not r1013.pad_axes_constant
    assert not r1013.block_quantization and r1014.block_quantization
    assert all("onnx-tensorrt" in r.source for r in RULES.values())
    assert [r.needs_lowering for r in (r85, r86, r101, r1013, r111)] == [True, True, False, False, False]
    assert not r1013.inferred and not r1016.inferred and rules_for("10.9").inferred and rules_for("11.4").inferred
    assert any("346bdcae" in c for c in r1013.changes) and any("7c51a63a" in c for c in r111.changes)


@pytest.mark.parametrize("version, key, opset", [("8.5.2", "8.5", 17), ("8.6.1", "8.6", 17), ("10.0", "10.0", 20),
                                                 ("10.3.0", "10.3", 20), ("10.13.3", "10.13", 23), ("10.14", "10.14", 24),
                                                 ("10.16.1", "10.16", 24), ("11.4.0", "11.4", 24)])
def test_rules_for_version(version, key, opset):
    rules = rules_for(version)
    assert rules.key == key and rules.opset_max == opset


def test_attention_graph_is_refused_before_1014_and_flagged_after():
    q = helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, 3, 197, 64])
    out = helper.make_tensor_value_info("o", TensorProto.FLOAT, None)
    node = helper.make_node("Attention", ["q", "q", "q"], ["o"], name="attn")
    model = _model([node], [q], [out], opset=23)
    r1013 = lint_model(model, rules_for("10.13"))
    assert [f.rule for f in r1013.findings] == ["no importer for Attention"]
    assert "re-export at opset <= 22" in r1013.findings[0].detail and not r1013.findings[0].lowerable
    r1016 = lint_model(model, rules_for("10.16"))
    assert r1016.findings == [] and "NVIDIA/TensorRT#4739" in r1016.notes[0]
    assert "#4705" in " ".join(r1016.lines())
    # a version without its own stored parser source says which facts it stands on
    r105 = lint_model(model, rules_for("10.5"))
    assert {f.rule for f in r105.findings} >= {"no importer for Attention"} and r105.notes == [
        "no parser source stored for 10.5: facts of 10.1 and the changelog entries up to it"]
    assert lint_model(model, rules_for("10.13")).notes == []  # 10.13's parser commit is stored


# -- small graphs ------------------------------------------------------------------------------------
def _model(nodes, inputs, outputs, inits=(), opset=20):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _f(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def _run(model, feeds):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _rules(report):
    return sorted({f.rule for f in report.findings})


def test_lint_flags_viT_relevant_restrictions():
    scales = numpy_helper.from_array(np.array([2.0, 1.0, 2.0, 2.0], np.float32), "scales")
    zp = numpy_helper.from_array(np.array(3, np.int8), "zp")
    sc = numpy_helper.from_array(np.array(0.1, np.float32), "sc")
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    nodes = [
        helper.make_node("Resize", ["x", "", "scales"], ["r"], name="resize_cubic_outer", mode="cubic"),
        helper.make_node("Resize", ["x", "", "scales2"], ["r2"], name="resize_aa", mode="linear", antialias=1),
        helper.make_node("QuantizeLinear", ["x", "sc", "zp"], ["q"], name="q_asym"),
        helper.make_node("DequantizeLinear", ["q", "sc"], ["dq"], name="dq_no_zp"),
        helper.make_node("ReduceMean", ["x", "axes"], ["m"], name="mean18"),
        helper.make_node("Cast", ["x"], ["u8"], name="to_u8", to=TensorProto.UINT8),
        helper.make_node("Cast", ["u8"], ["back"], name="from_u8", to=TensorProto.FLOAT),
        helper.make_node("Gelu", ["x"], ["g"], name="gelu"),
    ]
    scales2 = numpy_helper.from_array(np.array([1.0, 1.0, 2.0, 2.0], np.float32), "scales2")
    model = _model(nodes, [_f("x", [1, 3, 4, 4])], [_f(o, None) for o in ("r", "r2", "dq", "m", "back", "g")],
                   [scales, scales2, zp, sc, axes])
    r86 = lint_model(model, RULES["8.6"])
    assert _rules(r86) == sorted([
        "opset 20 > 17", "Resize cubic beyond the innermost 2 dimensions", "Resize antialias=1",
        "QuantizeLinear zero point not zero", "DequantizeLinear without a zero-point input",
        "ReduceMean axes given as an input (opset 18 form)", "UINT8 intermediate tensor", "no importer for Gelu",
    ])
    lowerable = {f.rule for f in r86.findings if f.lowerable}
    assert lowerable == {"opset 20 > 17", "ReduceMean axes given as an input (opset 18 form)", "no importer for Gelu"}
    r103 = lint_model(model, rules_for("10.3"))
    assert "no importer for Gelu" not in _rules(r103) and "Resize antialias=1" in _rules(r103)
    assert not any(f.lowerable for f in r103.findings)  # 10.x: nothing to lower, the graph must change
    assert "DequantizeLinear without a zero-point input" not in _rules(r103)


def test_gelu_and_layernorm_lowering_match_onnx_runtime():
    rng = np.random.default_rng(0)
    g = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "g")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")
    nodes = [
        helper.make_node("Gelu", ["x"], ["exact"], name="gelu"),
        helper.make_node("Gelu", ["x"], ["tanh"], name="gelu_tanh", approximate="tanh"),
        helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16),
        helper.make_node("LayerNormalization", ["x16", "g16", "b16"], ["ln16"], name="ln16", axis=-1, epsilon=1e-6),
        helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], name="ln", axis=-1, epsilon=1e-6),
    ]
    g16 = numpy_helper.from_array(numpy_helper.to_array(g).astype(np.float16), "g16")
    b16 = numpy_helper.from_array(numpy_helper.to_array(b).astype(np.float16), "b16")
    model = _model(nodes, [_f("x", ["n", 5, 8])],
                   [_f("exact", ["n", 5, 8]), _f("tanh", ["n", 5, 8]), _f("ln16", ["n", 5, 8], TensorProto.FLOAT16), _f("ln", ["n", 5, 8])],
                   [g, b, g16, b16])
    x = (rng.standard_normal((3, 5, 8)) * 3).astype(np.float32)
    want = _run(model, {"x": x})
    for key in ("8.5", "8.6"):
        lowered, record = lower_for(model, RULES[key])
        ops = [n.op_type for n in lowered.graph.node]
        assert "Gelu" not in ops and lowered.opset_import[0].version == 17 and lowered.ir_version == 8
        assert record["rewrites"]["Gelu -> Erf form"] == 1 and record["rewrites"]["Gelu -> tanh form"] == 1
        assert ("LayerNormalization" in ops) is (key == "8.6")
        got = _run(lowered, {"x": x})
        for name, a, b_ in zip(("exact", "tanh", "ln16", "ln"), want, got):
            tol = 2e-3 if name == "ln16" else 1e-5
            assert np.abs(a.astype(np.float64) - b_).max() <= tol, (key, name)
        if key == "8.5":
            # the fp16 LayerNorm is decomposed in fp32: Cast up before, Cast back after, fp32 Pow/Sqrt between
            ln_nodes = [n for n in lowered.graph.node if n.name.startswith("ln16.lowered")]
            casts = [n for n in ln_nodes if n.op_type == "Cast"]
            assert [helper.get_attribute_value(c.attribute[0]) for c in (casts[0], casts[-1])] == [TensorProto.FLOAT, TensorProto.FLOAT16]
            assert {"ReduceMean", "Sub", "Pow", "Sqrt", "Div"} <= {n.op_type for n in ln_nodes}


def test_opset18_forms_are_rewritten_and_verified():
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    sizes = numpy_helper.from_array(np.array([1, 2, 6, 6], np.int64), "sizes")
    nodes = [
        helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1),
        helper.make_node("Split", ["x"], ["s0", "s1"], axis=1, num_outputs=2),
        helper.make_node("Resize", ["x", "", "", "sizes"], ["r"], mode="cubic", antialias=0, keep_aspect_ratio_policy="stretch",
                         coordinate_transformation_mode="half_pixel"),
    ]
    outs = [_f("m", [1, 2, 4, 1]), _f("s0", [1, 1, 4, 4]), _f("s1", [1, 1, 4, 4]), _f("r", [1, 2, 6, 6])]
    model = _model(nodes, [_f("x", [1, 2, 4, 4])], outs, [axes, sizes])
    x = np.random.default_rng(1).standard_normal((1, 2, 4, 4)).astype(np.float32)
    lowered, record = lower_for(model, RULES["8.6"])
    assert set(record["rewrites"]) >= {"ReduceMean axes input -> attribute", "Split num_outputs -> equal split",
                                       "Resize opset-18 attributes dropped (defaults)"}
    for a, b in zip(_run(model, {"x": x}), _run(lowered, {"x": x})):
        assert np.array_equal(a, b)
    # nothing the lowering cannot express is rewritten silently
    bad = _model([helper.make_node("Resize", ["x", "", "", "sizes"], ["r"], mode="cubic", antialias=1)],
                 [_f("x", [1, 2, 4, 4])], [_f("r", [1, 2, 6, 6])], [sizes])
    with pytest.raises(LoweringError, match="antialias=1"):
        lower_for(bad, RULES["8.6"])


def test_qdq_per_channel_axes_are_kept():
    w = numpy_helper.from_array(np.random.default_rng(2).standard_normal((4, 3)).astype(np.float32), "w")
    scale = numpy_helper.from_array(np.array([0.1, 0.2, 0.3], np.float32), "scale")
    zp = numpy_helper.from_array(np.zeros(3, np.int8), "zp")
    nodes = [
        helper.make_node("QuantizeLinear", ["w", "scale", "zp"], ["wq"], axis=1),
        helper.make_node("DequantizeLinear", ["wq", "scale", "zp"], ["wd"], axis=1),
        helper.make_node("MatMul", ["x", "wd"], ["y0"]),
        helper.make_node("Gelu", ["y0"], ["y"]),
    ]
    model = _model(nodes, [_f("x", [2, 4])], [_f("y", [2, 3])], [w, scale, zp])
    lowered, _ = lower_for(model, RULES["8.5"])
    qdq = [(n.op_type, list(n.input), [(a.name, a.i) for a in n.attribute]) for n in lowered.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert qdq == [("QuantizeLinear", ["w", "scale", "zp"], [("axis", 1)]), ("DequantizeLinear", ["wq", "scale", "zp"], [("axis", 1)])]
    x = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)
    assert np.abs(_run(model, {"x": x})[0] - _run(lowered, {"x": x})[0]).max() <= 1e-5
    onnx.checker.check_model(lowered, full_check=True)
