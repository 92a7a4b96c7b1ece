"""Issue 38: transformers' DINOv2 with registers (``Dinov2WithRegistersForImageClassification``,
``Dinov2WithRegistersModel``) and DINOv3 (``DINOv3ViTModel``), exported from a real offline hub cache
(tests/hf_cache.py) as ``hf:ORG/NAME``, as a user's would.

Parity is with transformers' own forward, fed by the repository's own image processor (do_resize=False,
do_center_crop=False, so the comparison measures the model and its normalisation) on real photographs
(tests/photos.py), at the bundle's size and at other sizes (non-square among them), within the export
gate's bounds. Test weights are random but not degenerate: LayerScale ~0.5, register and CLS tokens,
the position table and the classifier with real values (transformers initialises the registers to
zero and DINOv3's LayerScale to 1e-5 in the released configs).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hf_cache import offline_hub, write_folder
from photos import real_photos

from vitdeploy.compare import reference_spread
from vitdeploy.errors import UserError
from vitdeploy.runtime.ort import OrtRunner
from qdq_checks import dequantized_inputs

pytestmark = pytest.mark.slow  # exports

ORG = "vitdeploy-test"
DYNAMIC = {"dinov2-reg": {"dynamic_resolution": True, "outputs": ("logits", "embedding", "patch_grid")},
           "dinov3": {"dynamic_resolution": True}}
LABELS = {i: f"kind-{i}" for i in range(4)}
MEAN, STD = [0.4, 0.5, 0.6], [0.2, 0.25, 0.3]


def _repositories():
    import transformers as T

    labels = dict(num_labels=4, id2label=LABELS, label2id={v: k for k, v in LABELS.items()})
    reg = dict(image_size=112, patch_size=14, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_register_tokens=4)
    # DINOv2's processor: shortest edge 64, centre crop 56 (a 4x4 grid from an 8x8 table: the antialiased shrink)
    bit = T.BitImageProcessor(size={"shortest_edge": 64}, crop_size={"height": 56, "width": 56}, image_mean=MEAN, image_std=STD,
                              resample=3)
    v3 = dict(image_size=64, patch_size=16, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
              num_register_tokens=4, use_gated_mlp=True, hidden_act="silu")
    return {
        "dinov2-reg": (T.Dinov2WithRegistersForImageClassification(T.Dinov2WithRegistersConfig(**reg, **labels)), bit),
        "dinov2-reg-backbone": (T.Dinov2WithRegistersModel(T.Dinov2WithRegistersConfig(**reg, use_swiglu_ffn=True)), bit),
        "dinov3": (T.DINOv3ViTModel(T.DINOv3ViTConfig(**v3)),
                   T.DINOv3ViTImageProcessor(size={"height": 64, "width": 64}, image_mean=MEAN, image_std=STD)),
    }


def _give_weights(model: torch.nn.Module) -> None:
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("lambda1"):  # LayerScale ~0.5: a near-zero scale would hide a wrong residual branch
                p.copy_(0.5 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith(("register_tokens", "cls_token")):
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name.endswith("position_embeddings"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif name.startswith("classifier") and name.endswith("weight"):
                p.copy_(torch.randn(p.shape, generator=gen))


def _write(root: Path) -> None:
    home = root / "hf-home"
    torch.manual_seed(0)
    for key, (model, processor) in _repositories().items():
        _give_weights(model)
        folder = root / "models" / key
        model.save_pretrained(folder)
        processor.save_pretrained(folder)
        write_folder(home, f"{ORG}/{key}", folder)


@pytest.fixture(scope="module")
def hub(shared_artifact, export_cached):
    """The three repositories in a hub cache; ``hub["export"](key, **options)`` exports one offline (cached)."""
    root = shared_artifact(["hf-dino-families", 1], _write)
    home = root / "hf-home"

    def export(key: str, **options):
        with pytest.MonkeyPatch.context() as mp:
            offline_hub(mp, home)
            return export_cached(f"hf:{ORG}/{key}", check_images=2, simplify=False, **options)

    return {"home": home, "models": root / "models", "export": export}


def _transformers(hub, key: str, images: np.ndarray) -> dict[str, np.ndarray]:
    """transformers' own model and processor, read from the saved folder, on ``images`` as they are."""
    import transformers as T

    folder = hub["models"] / key
    config = T.AutoConfig.from_pretrained(folder)
    model = getattr(T, config.architectures[0]).from_pretrained(folder).eval()
    processor = T.AutoImageProcessor.from_pretrained(folder)
    x = processor(list(images), do_resize=False, do_center_crop=False, return_tensors="pt")["pixel_values"]
    prefix = 1 + config.num_register_tokens
    with torch.no_grad():
        if hasattr(model, "classifier"):
            head_input = []
            model.classifier.register_forward_hook(lambda _m, args, _o: head_input.append(args[0]))
            out = model(pixel_values=x, output_hidden_states=True)
            base = model.dinov2_with_registers(pixel_values=x)
            return {"logits": out.logits.numpy(), "embedding": head_input[0].numpy(),
                    "patch_grid": base.last_hidden_state[:, prefix:].numpy(), "tokens": base.last_hidden_state.numpy()}
        out = model(pixel_values=x)
    return {"embedding": out.pooler_output.numpy(), "patch_grid": out.last_hidden_state[:, prefix:].numpy()}


def _assert_parity(bundle, hub, key: str, height: int, width: int, count: int = 4) -> dict[str, np.ndarray]:
    images = real_photos(count, height, width)
    with OrtRunner(bundle.artifact_path("fp32")) as runner:
        got = runner.infer(images)
    want = _transformers(hub, key, images)
    compared = [name for name in ("logits", "embedding", "patch_grid") if name in got]
    assert compared
    for name in compared:
        value = got[name]
        if name == "patch_grid":  # [B, d, G_h, G_w] -> transformers' row-major patch tokens
            assert value.shape[2:] == (height // bundle.spec.patch_size[0], width // bundle.spec.patch_size[1])
            value = value.reshape(value.shape[0], value.shape[1], -1).transpose(0, 2, 1)
        diff = float(np.abs(value - want[name]).max())
        assert diff <= 1e-4 and diff <= 0.01 * reference_spread(want[name]), (name, height, width, diff)
    return want


# -- DINOv2 with registers ---------------------------------------------------------------------------
def test_dinov2_registers_classifier_matches_transformers(hub):
    bundle = hub["export"]("dinov2-reg")
    manifest = bundle.manifest
    assert manifest["labels"] == [LABELS[i] for i in range(4)]
    pre = bundle.preprocessing
    assert pre["mean"] == pytest.approx(MEAN) and pre["std"] == pytest.approx(STD)
    assert tuple(pre["input_size"]) == (56, 56) and pre["host_resize"]["mode"] == "shorter-side-center-crop"
    assert manifest["resolution"]["native"] == [112, 112]  # the table's size, resampled to the processor's 56
    # transformers' own rule for this family: antialiased bicubic, recorded as the bundle's convention
    assert manifest["resolution"]["pos_embed_interpolation"]["antialias"] is True
    spec = bundle.spec
    assert spec.num_reg_tokens == 4 and spec.num_prefix_tokens == 5 and spec.pos_embed_prefix_rows == 1
    want = _assert_parity(bundle, hub, "dinov2-reg", 56, 56)
    assert np.abs(want["logits"]).max() > 0.1


def test_dinov2_registers_dynamic_reads_out_as_transformers(hub):
    """logits, the classifier's input ([CLS, mean of the patches, registers left out]) and the patch grid
    without CLS and registers, at the processor's size, the table's own, an enlarged and a shrunk non-square size."""
    bundle = hub["export"]("dinov2-reg", **DYNAMIC["dinov2-reg"])
    record = bundle.manifest["records"]["export_check"]
    assert record["passed"], record["failures"]
    assert bundle.resolution["height"] == 56 and bundle.spec.max_grid == (64, 64)
    for height, width in ((56, 56), (112, 112), (112, 70), (42, 70)):  # processor, table, enlarged, shrunk
        want = _assert_parity(bundle, hub, "dinov2-reg", height, width)
        # the head's mean leaves the registers out: with them the read-out would differ
        tokens = want["tokens"]
        with_registers = np.concatenate([tokens[:, 0], tokens[:, 1:].mean(axis=1)], axis=1)
        assert np.abs(with_registers - want["embedding"]).max() > 1e-2
    assert bundle.manifest["graph"]["output_details"]["embedding"]["shape"] == ["batch", 128]
    assert "1 + num_register_tokens" in bundle.manifest["graph"]["output_details"]["patch_grid"]["reference"]


def test_dinov2_registers_backbone_matches_transformers(hub):
    bundle = hub["export"]("dinov2-reg-backbone")
    assert bundle.manifest["graph"]["outputs"] == ["embedding", "patch_grid"] and bundle.manifest["labels"] == []
    assert bundle.spec.mlp_kind == "gated"
    _assert_parity(bundle, hub, "dinov2-reg-backbone", 56, 56)


def test_dinov2_registers_other_conventions_are_refused_in_one_line(hub, monkeypatch, tmp_path):
    from vitdeploy.exporters import ExportOptions, export
    from vitdeploy.posembed import PosEmbedInterpolation

    offline_hub(monkeypatch, hub["home"])
    with pytest.raises(UserError) as err:
        export(f"hf:{ORG}/dinov2-reg", tmp_path / "b", ExportOptions(interpolation=PosEmbedInterpolation("bilinear", False, False)))
    assert "antialias=True" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "b").exists()


# -- DINOv3 ------------------------------------------------------------------------------------------
def test_dinov3_matches_transformers_native_and_non_square(hub):
    native = hub["export"]("dinov3")
    spec = native.spec
    assert native.manifest["graph"]["outputs"] == ["embedding", "patch_grid"] and native.manifest["labels"] == []
    assert spec.num_reg_tokens == 4 and not spec.abs_pos_embed and spec.mlp_kind == "gated"
    assert spec.position_kinds == ("rotary",) and "patch-centre" in spec.rotary["rule"]
    assert native.manifest["source"]["architecture"] == "DINOv3ViTModel"
    _assert_parity(native, hub, "dinov3", 64, 64)
    static = hub["export"]("dinov3", resolution=(48, 96))
    _assert_parity(static, hub, "dinov3", 48, 96)


def test_dinov3_dynamic_computes_its_rotary_in_the_graph(hub):
    import onnx

    bundle = hub["export"]("dinov3", **DYNAMIC["dinov3"])
    record = bundle.manifest["records"]["export_check"]
    assert record["passed"], record["failures"]
    for height, width in ((64, 64), (96, 48), (128, 80)):
        _assert_parity(bundle, hub, "dinov3", height, width)
    ops = {node.op_type for node in onnx.load(str(bundle.artifact_path("fp32"))).graph.node}
    assert {"Sin", "Cos", "Range"} <= ops  # the angles come from the input's shape
    assert not ops & {"If", "Tile", "Loop"}


# -- what every family must have -------------------------------------------------------------------
@pytest.mark.parametrize("key", ["dinov2-reg", "dinov2-reg-backbone", "dinov3"])
def test_cost_model_counts_the_parameters_and_macs(hub, key):
    """param_count(spec) = the model's parameters (the training-only mask token aside); the MACs of the
    linear layers, the patch embedding and the head, counted by hooks on transformers' forward at the
    bundle's size, plus the attention products, = vit_costs' total."""
    import transformers as T

    from vitdeploy.costs import vit_costs

    folder = hub["models"] / key
    model = getattr(T, T.AutoConfig.from_pretrained(folder).architectures[0]).from_pretrained(folder).eval()
    bundle = hub["export"](key)
    spec = bundle.spec
    params = sum(p.numel() for name, p in model.named_parameters() if not name.endswith("mask_token"))
    native = spec.with_image_size(*bundle.manifest["resolution"]["native"])  # the table as stored (DINOv2: 8x8)
    assert vit_costs(native).params == params
    report = vit_costs(spec)
    macs = []

    def count(module, args, out):
        if isinstance(module, torch.nn.Linear):
            macs.append(out.numel() * module.in_features)
        elif isinstance(module, torch.nn.Conv2d):
            macs.append(out.numel() * module.in_channels * module.kernel_size[0] * module.kernel_size[1])

    for module in model.modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Conv2d)):
            module.register_forward_hook(count)
    height, width = spec.image_size
    with torch.no_grad():
        model(pixel_values=torch.zeros(1, 3, height, width))
    attention = spec.depth * 2 * report.seq_len ** 2 * spec.embed_dim
    assert report.seq_len == report.num_patches + 5
    assert sum(macs) + attention == report.macs_total


@pytest.mark.parametrize("key", ["dinov2-reg", "dinov3"])
def test_build_engine_lint_every_tensorrt(hub, key, copy_bundle):
    """The dynamic graphs parse with TensorRT 10.x and 11.x as they are, and with 8.6/8.5 after the lowering
    (verified with ONNX Runtime at the profile's sizes before it is planned)."""
    from click.testing import CliRunner

    from vitdeploy.cli import main

    root = copy_bundle(hub["export"](key, **DYNAMIC[key]))
    patch = 14 if key == "dinov2-reg" else 16
    sizes = f"{4 * patch}:{6 * patch}:{8 * patch}"
    for version in ("10.3", "11.0", "8.6", "8.5"):
        res = CliRunner().invoke(main, ["build-engine", str(root), "--dry-run", "--trt-version", version, "--resolution", sizes,
                                        "--precision", "fp32"])
        assert res.exit_code == 0, res.output
        assert "nothing it cannot parse" in res.output, (version, res.output)


def test_dinov2_registers_fp16_and_int8_pass_their_gates_with_positions_in_float(hub, copy_bundle, tmp_path, monkeypatch):
    """The in-graph table (gathered weights, two MatMuls on constants) stays fp32 in the fp16 graph and has
    no Q/DQ in the int8 one; both pass their gates (int8 relative: agreement and cosine on held-out photos),
    and `check` (transformers' model rebuilt from the cache, by the recorded convention) gates all three
    at every size it feeds (a table quantized per tensor, as before calibration/qdq.py excluded the
    position subgraph, left the patch grid at cosine 0.87 at 2x the grid)."""
    import onnx

    from vitdeploy.bundle import Bundle
    from vitdeploy.calibration.api import CalibrateOptions, calibrate_bundle
    from vitdeploy.checks import CheckOptions, run_check
    from vitdeploy.exporters.fp16 import add_fp16_to_bundle, tensor_elem_types
    from vitdeploy.exporters.position_nodes import position_subgraph_nodes

    root = copy_bundle(hub["export"]("dinov2-reg", **DYNAMIC["dinov2-reg"]))
    position = set(position_subgraph_nodes(onnx.load(str(root / "model.onnx"))))
    assert any(name for name in position)
    add_fp16_to_bundle(Bundle.open(root))
    fp16 = onnx.load(str(root / "model.fp16.onnx"))
    types = tensor_elem_types(fp16)
    matmuls = [n for n in fp16.graph.node if n.name in position and n.op_type == "MatMul"]
    assert len(matmuls) == 2  # the table, along rows then columns
    for node in matmuls:
        assert all(types.get(t) == onnx.TensorProto.FLOAT for t in list(node.input) + list(node.output) if types.get(t) in (1, 10))
    record = Bundle.open(root).artifact_record("fp16")
    assert record["gate"]["passed"] and record["sanity"]["top1_agreement"] == 1.0
    photos = real_photos(24, 56, 56)
    np.save(tmp_path / "calib.npy", photos[:16])
    np.save(tmp_path / "held.npy", photos[16:])
    result = calibrate_bundle(root, CalibrateOptions(data=str(tmp_path / "calib.npy"), eval_data=str(tmp_path / "held.npy"), method="minmax"))
    assert result["evaluation"]["gate"]["passed"], result["evaluation"]
    int8 = onnx.load(str(root / "model.int8.onnx"))
    assert dequantized_inputs(int8, position) == []  # the table's MatMuls read float constants
    consumers: dict[str, list] = {}
    for node in int8.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    readers = [c for n in int8.graph.node if n.op_type == "DequantizeLinear" for c in consumers.get(n.output[0], [])]
    # Q/DQ on linear-layer inputs only; the classifier's input is also the embedding output, read through its Identity
    assert {c.op_type for c in readers} - {"Identity"} == {"MatMul", "Gemm", "Conv"}
    assert all(c.output[0] in {o.name for o in int8.graph.output} for c in readers if c.op_type == "Identity")
    offline_hub(monkeypatch, hub["home"])
    report = run_check(root, CheckOptions(random_count=8, write_report=False))
    assert report["passed"], report["failures"]
    assert {a["precision"] for a in report["artifacts"] if a["gated"]} == {"fp32", "fp16", "int8"}


def test_dinov3_check_gates_fp32_fp16_int8_with_rotary_in_float(hub, copy_bundle, tmp_path, monkeypatch):
    """`check` rebuilds transformers' model from the cache and gates every precision on the embedding and
    the patch grid (a headless model: calibrate's own gate needs logits, check's reads the embedding)."""
    import onnx

    from vitdeploy.bundle import Bundle
    from vitdeploy.calibration.api import CalibrateOptions, calibrate_bundle
    from vitdeploy.checks import CheckOptions, run_check
    from vitdeploy.exporters.fp16 import add_fp16_to_bundle, tensor_elem_types
    from vitdeploy.exporters.position_nodes import position_subgraph_nodes, rotary_application_nodes

    root = copy_bundle(hub["export"]("dinov3", **DYNAMIC["dinov3"]))
    fp32 = onnx.load(str(root / "model.onnx"))
    rotary, position = set(rotary_application_nodes(fp32)), set(position_subgraph_nodes(fp32))
    assert len(rotary) >= 2 * 2 * 2  # 2 blocks x (q, k) x (cos, sin products)
    add_fp16_to_bundle(Bundle.open(root))
    fp16 = onnx.load(str(root / "model.fp16.onnx"))
    types = tensor_elem_types(fp16)
    kept = [n for n in fp16.graph.node if n.name in rotary or n.op_type in ("Sin", "Cos")]
    assert any(n.op_type in ("Sin", "Cos") for n in kept)
    for node in kept:
        floats = [types.get(t) for t in list(node.input) + list(node.output) if types.get(t) in (1, 10)]
        assert floats and all(t == onnx.TensorProto.FLOAT for t in floats), node.name
    np.save(tmp_path / "calib.npy", real_photos(16, 64, 64))
    np.save(tmp_path / "held.npy", real_photos(28, 64, 64)[16:])
    record = calibrate_bundle(root, CalibrateOptions(data=str(tmp_path / "calib.npy"), eval_data=str(tmp_path / "held.npy"), method="minmax"))
    assert record["evaluation"]["gate"]["passed"] and record["evaluation"]["reference"]["scored"] == "embedding"  # headless: the embedding
    int8 = onnx.load(str(root / "model.int8.onnx"))
    assert dequantized_inputs(int8, position | rotary) == []
    offline_hub(monkeypatch, hub["home"])
    report = run_check(root, CheckOptions(random_count=8, write_report=False))
    assert report["passed"], report["failures"]
    gated = {a["precision"] for a in report["artifacts"] if a["gated"]}
    assert gated == {"fp32", "fp16", "int8"}


def test_module_names_and_lookup(hub, monkeypatch):
    """check's localisation and debug-precision's cells name modules that exist; a config without
    ``architectures`` maps to the family's class; variable size is refused in one line."""
    import types

    from vitdeploy.exporters.adapters import hf_adapter
    from vitdeploy.exporters.sources import load_source

    offline_hub(monkeypatch, hub["home"])
    expected = {"dinov2-reg": "hf.classifier", "dinov2-reg-backbone": "hf.layernorm", "dinov3": "hf.norm"}
    for key, last in expected.items():
        loaded = load_source(f"hf:{ORG}/{key}")
        names = loaded.adapter.module_names(loaded)
        assert set(names) <= {name for name, _ in loaded.model.named_modules()}
        assert len(names) == loaded.spec.depth + (2 if key == "dinov2-reg" else 1) and names[-1] == last
        with pytest.raises(UserError) as err:
            loaded.adapter.variable_parts(loaded)
        assert "\n" not in str(err.value)
    adapter, arch = hf_adapter(types.SimpleNamespace(model_type="dinov3_vit", architectures=None), "hf:x")
    assert adapter.name == "hf-dinov3" and arch == "DINOv3ViTModel"
    config = json.loads((hub["models"] / "dinov3" / "config.json").read_text())
    assert config["architectures"] == ["DINOv3ViTModel"]
