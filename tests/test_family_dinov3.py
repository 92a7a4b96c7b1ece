"""Issue 38: timm DINOv3 ViTs (``vit_*_patch16_dinov3[_qkvb]``: timm's Eva with DINOv3's rotary
positions, 4 registers and LayerScale) through their adapter (exporters/adapters/timm_dinov3.py).

The published weights are read from a real offline Hugging Face cache (tests/hf_cache.py) written
from a small seeded model (depth 2, width 64, 112 px), exported as a user would:
``timm:vit_small_patch16_dinov3.lvd1689m`` with ``--model-arg``s for the small architecture.
LayerScale is set to ~0.5 (timm initialises it to 1e-5, which would hide every block), the register
and CLS tokens and the q/v biases get real values. Parity is against timm's own model loaded from
that cache (``timm.create_model(..., pretrained=True)``) with timm's own transform's normalisation,
on real photographs, at the trained size and a non-square size, within the export gate's bounds.
"""

from __future__ import annotations

import collections
import json
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from hf_cache import offline_hub, write_state_dict
from photos import real_photos

from vitdeploy.errors import UserError
from qdq_checks import dequantized_consumers, dequantized_inputs

pytestmark = pytest.mark.slow

NAME = "vit_small_patch16_dinov3.lvd1689m"
ARGS = {"depth": 2, "embed_dim": 64, "num_heads": 2, "img_size": 112}
NATIVE = (112, 112)
NON_SQUARE = (80, 128)  # static export
DYNAMIC_OTHER = (96, 160)  # a non-square size of the dynamic bundle
# a fine-tuned classifier (the _qkvb variant, upstream's CLS read-out), given as --checkpoint
CLASSIFIER = "vit_base_patch16_dinov3_qkvb"
CLASSIFIER_ARGS = {"depth": 2, "embed_dim": 64, "num_heads": 2, "img_size": 96, "global_pool": "token"}


def _trained_like(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Real values where timm initialises to ~0: LayerScale ~0.5, tokens, q/v biases, the head; and q/k
    large enough that attention follows the rotary positions (a wrong rope then moves the outputs)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "gamma_" in name:
                p.copy_(0.4 + 0.2 * torch.rand(p.shape, generator=gen))
            elif name in ("cls_token", "reg_token") or name.endswith(("q_bias", "v_bias")):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif name.endswith("attn.qkv.weight"):  # attention logits of order 1: what a token attends to depends on position
                p.copy_(torch.randn(p.shape, generator=gen) * 0.25)
            elif name.startswith("head") and name.endswith("weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
            elif p.dim() >= 2:
                p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    return model.eval()


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """HF_HOME holding timm/vit_small_patch16_dinov3.lvd1689m (small, seeded), offline, for this module."""
    import timm
    from safetensors.torch import save_file

    home = tmp_path_factory.mktemp("hf-home")
    torch.manual_seed(0)
    published = _trained_like(timm.create_model(NAME.split(".")[0], pretrained=False, **ARGS), seed=1)
    write_state_dict(home, f"timm/{NAME}", published)
    classifier = _trained_like(timm.create_model(CLASSIFIER, pretrained=False, num_classes=10, **CLASSIFIER_ARGS), seed=2)
    checkpoint = tmp_path_factory.mktemp("dinov3-ft") / "ft.safetensors"
    save_file({k: v.contiguous() for k, v in classifier.state_dict().items()}, str(checkpoint))
    with pytest.MonkeyPatch.context() as patch:
        offline_hub(patch, home)
        yield {"home": home, "classifier": classifier, "checkpoint": str(checkpoint)}


@pytest.fixture(scope="module")
def bundles(hub, export_cached):
    source = f"timm:{NAME}"
    return {
        "dynamic": export_cached(source, model_kwargs=ARGS, dynamic_resolution=True),
        "static": export_cached(source, model_kwargs=ARGS, resolution=NON_SQUARE),
        "classifier": export_cached(f"timm:{CLASSIFIER}", checkpoint=hub["checkpoint"], model_kwargs=CLASSIFIER_ARGS,
                                    outputs=("logits", "embedding", "patch_grid")),
    }


def _timm_published():
    """timm's own model from the offline cache, as a user would load it."""
    import timm

    return timm.create_model(NAME, pretrained=True, **ARGS).eval()


def _timm_outputs(model, images: np.ndarray) -> dict[str, np.ndarray]:
    """timm's forward on ``images`` normalised by timm's own eval transform (without its resize/crop)."""
    import timm
    from PIL import Image
    from torchvision.transforms import Compose

    config = timm.data.resolve_model_data_config(model)
    normalise = Compose(timm.data.create_transform(**config, is_training=False).transforms[-2:])  # to-tensor, normalise
    assert type(normalise.transforms[-1]).__name__ == "Normalize"
    x = torch.stack([normalise(Image.fromarray(image)) for image in images])
    with torch.no_grad():
        tokens = model.forward_features(x)
        out = {"embedding": model.forward_head(tokens, pre_logits=True).numpy()}
        if model.num_classes:
            out["logits"] = model.forward_head(tokens).numpy()
    gh, gw = x.shape[-2] // 16, x.shape[-1] // 16
    patches = tokens[:, model.num_prefix_tokens:]  # CLS and the 4 registers dropped
    out["patch_grid"] = patches.reshape(len(x), gh, gw, -1).permute(0, 3, 1, 2).numpy()
    return out


def _assert_within_gate(got: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> None:
    from vitdeploy.compare import reference_spread

    for name, want in ref.items():
        assert got[name].shape == want.shape, name
        diff = float(np.abs(got[name] - want).max())
        assert diff <= 1e-4 and diff <= 0.01 * reference_spread(want), (name, diff, reference_spread(want))


def _ort(bundle, images: np.ndarray) -> dict[str, np.ndarray]:
    from vitdeploy.runtime.ort import OrtRunner

    with OrtRunner(bundle.artifact_path("fp32")) as runner:
        return runner.infer(images)


# -- the adapter, the spec and the cost terms (no export) --------------------------------------------
@pytest.mark.parametrize("name", ["vit_small_patch16_dinov3", "vit_base_patch16_dinov3_qkvb", "vit_large_patch16_dinov3"])
def test_dinov3_is_claimed_and_its_spec_counts_registers_rotary_and_layer_scale(name):
    import timm

    from vitdeploy.costs import param_count, vit_costs
    from vitdeploy.exporters.adapters import timm_adapter

    with torch.device("meta"):
        model = timm.create_model(name, pretrained=False)
        eva02 = timm.create_model("eva02_tiny_patch14_224", pretrained=False)
    adapter = timm_adapter(model, name)
    assert adapter.name == "timm-dinov3" and timm_adapter(eva02, "eva02_tiny_patch14_224").name == "timm-eva"
    spec = adapter.spec(model, name)
    assert spec.architecture == "dinov3" and spec.image_size == (256, 256) and spec.patch_size == (16, 16)
    assert spec.num_reg_tokens == 4 and spec.num_prefix_tokens == 5 and spec.global_pool == "avg"
    assert not spec.abs_pos_embed and spec.rotary["type"] == "dinov3" and spec.rotary["normalize_coords"] == "separate"
    assert "patch centres" in spec.position_rules()[0] and spec.position_kinds == ("rotary",)
    # the parameter count (standard ViT + the family's terms: LayerScale, q/v-only or no qkv bias) is timm's
    assert param_count(spec) == sum(p.numel() for p in model.parameters())
    assert {t["name"] for t in spec.extra_terms} == {"layer-scale", "qkv-bias"}
    d, n = spec.embed_dim, 16 * 16
    report = vit_costs(spec, 256, 256)
    assert report.seq_len == n + 5  # CLS + 4 registers attend with the patches
    assert report.position_mults_per_layer == 4 * n * d and report.position_adds_per_layer == 2 * n * d
    assert report.macs_per_layer_linear == 4 * (n + 5) * d * d + 2 * (n + 5) * 4 * d * d
    assert report.macs_extra == 0  # LayerScale and biases are element-wise
    assert adapter.module_names(types.SimpleNamespace(spec=spec)) == [f"blocks.{i}" for i in range(spec.depth)] + ["norm", "head"]


def test_a_coordinate_rule_the_graph_does_not_compute_is_refused_in_one_line():
    import timm

    from vitdeploy.exporters.adapters import timm_adapter

    with torch.device("meta"):
        model = timm.create_model("vit_small_patch16_dinov3", pretrained=False, depth=1)
    model.rope.normalize_coords = "diagonal"  # not one of timm's separate/min/max
    with pytest.raises(UserError) as err:
        timm_adapter(model, "vit_small_patch16_dinov3")
    assert "\n" not in str(err.value) and "normalize_coords='diagonal'" in str(err.value)


def test_in_graph_rope_equals_timm_get_embed_at_every_grid():
    """The coordinates the dynamic graph computes (patch centres / G, per axis) = timm's own get_embed, for
    each normalisation, indexing and layout timm's RotaryEmbeddingDinoV3 has."""
    import timm

    from vitdeploy.exporters.adapters.timm_dinov3 import centred_rope_embed

    rope = timm.create_model("vit_small_patch16_dinov3", pretrained=False, depth=1, embed_dim=64, num_heads=2).rope
    for normalize in ("separate", "min", "max"):
        for indexing in ("ij", "xy"):
            for half in (True, False):
                rope.normalize_coords, rope.grid_indexing, rope.rotate_half = normalize, indexing, half
                for grid in [(7, 7), (5, 10), (16, 16), (12, 3), (1, 2)]:
                    want = rope.get_embed(shape=grid)
                    got = centred_rope_embed(rope, grid)
                    assert got.shape == want.shape == (grid[0] * grid[1], 2 * 32)
                    assert (got - want).abs().max().item() <= 1e-6, (normalize, indexing, half, grid)


def test_parity_would_catch_a_rope_baked_at_the_native_grid(hub):
    """What timm's get_embed becomes when traced as it is (float(G) a constant of the export grid): every
    grid's coordinates divided by the native G. On these test weights that moves the outputs far outside
    the parity gate used below, so the photo parity tests do measure the rotary rule."""
    import math

    model = _timm_published()
    rope, native = model.rope, model.patch_embed.grid_size[0]

    def baked(shape=None, dtype=None):
        axes = [(torch.arange(s, dtype=torch.float32) + 0.5) / native for s in shape]
        coords = 2.0 * torch.stack(torch.meshgrid(axes, indexing="ij"), dim=-1).flatten(0, 1) - 1.0
        angles = (2 * math.pi * coords[:, :, None] / rope.periods[None, None, :]).flatten(1)
        return torch.cat([angles.sin().repeat(1, 2), angles.cos().repeat(1, 2)], dim=-1)  # half layout

    grid = tuple(model.patch_embed.grid_size)
    assert (baked(grid) - rope.get_embed(shape=grid)).abs().max() <= 1e-6  # the same rule at the native grid
    images = real_photos(4, *DYNAMIC_OTHER)
    want = _timm_outputs(model, images)
    rope.get_embed = baked  # this instance only
    got = _timm_outputs(model, images)
    assert np.abs(got["patch_grid"] - want["patch_grid"]).max() > 100 * 1e-4


# -- exports from the offline hub cache -----------------------------------------------------------
def test_dynamic_bundle_matches_timm_on_photos_at_native_and_non_square(hub, bundles):
    bundle = bundles["dynamic"]
    record = bundle.manifest["records"]["export_check"]
    assert record["passed"], record["failures"]
    sizes = [(s["height"], s["width"]) for s in record["sizes"]]
    assert len(sizes) >= 3 and any(h != w for h, w in sizes)
    source = bundle.manifest["source"]
    assert source["weights"]["origin"] == "hf-hub" and source["weights"]["repo_id"] == f"timm/{NAME}" and not source["random_init"]
    assert bundle.spec.rotary["type"] == "dinov3" and bundle.manifest["spec"]["num_reg_tokens"] == 4
    grid = bundle.manifest["graph"]["output_details"]["patch_grid"]
    assert grid["dropped_tokens"] == {"cls": 1, "distillation": 0, "registers": 4} and grid["final_norm"] == "norm"
    assert bundle.manifest["graph"]["output_details"]["embedding"]["readout"] == "gap"  # timm's DINOv3 default global_pool='avg'
    # rotary computed in the graph from the input's shape, with nothing TensorRT rejects in dynamic graphs
    import onnx

    ops = collections.Counter(n.op_type for n in onnx.load(str(bundle.artifact_path("fp32"))).graph.node)
    assert ops["Sin"] and ops["Cos"] and ops["Range"] and not (ops["If"] or ops["Loop"] or ops["Tile"] or ops["Scan"])
    model = _timm_published()
    for size in (NATIVE, DYNAMIC_OTHER):
        images = real_photos(8, *size)
        _assert_within_gate(_ort(bundle, images), _timm_outputs(model, images))


def test_static_non_square_bundle_matches_timm_on_photos(hub, bundles):
    bundle = bundles["static"]
    assert bundle.manifest["records"]["export_check"]["passed"]
    assert tuple(bundle.spec.image_size) == NON_SQUARE and bundle.preprocessing["input_size"] == list(NON_SQUARE)
    images = real_photos(8, *NON_SQUARE)
    _assert_within_gate(_ort(bundle, images), _timm_outputs(_timm_published(), images))


def test_classifier_checkpoint_logits_and_cls_embedding_match_timm(hub, bundles):
    bundle = bundles["classifier"]
    assert bundle.manifest["records"]["export_check"]["passed"]
    assert bundle.manifest["graph"]["output_details"]["embedding"]["readout"] == "cls" and bundle.spec.num_classes == 10
    images = real_photos(8, 96, 96)
    ref = _timm_outputs(hub["classifier"], images)
    assert np.ptp(ref["logits"]) > 0.1  # a head whose logits move with the image
    _assert_within_gate(_ort(bundle, images), ref)


def test_check_passes_rebuilding_the_source_from_the_cache(hub, bundles, copy_bundle):
    from vitdeploy.checks import CheckOptions, run_check

    root = copy_bundle(bundles["dynamic"])
    report = run_check(root, CheckOptions(random_count=8, write_report=False))
    assert report["passed"], report["failures"]


def test_parser_lint_10_11_and_8x_after_lowering(bundles, copy_bundle):
    from click.testing import CliRunner

    from vitdeploy.cli import main

    root = copy_bundle(bundles["dynamic"])
    for version in ("10.3", "11.1"):
        res = CliRunner().invoke(main, ["build-engine", str(root), "--lint", "--trt-version", version])
        assert res.exit_code == 0 and "nothing it cannot parse" in res.output, res.output
    for version in ("8.5", "8.6"):  # lowered to opset 17, verified with ONNX Runtime, then linted
        res = CliRunner().invoke(main, ["build-engine", str(root), "--dry-run", "--trt-version", version,
                                        "--resolution", "80:112:160", "--precision", "fp32"])
        assert res.exit_code == 0 and "nothing it cannot parse" in res.output, res.output


# -- precision: rope stays fp32 and out of Q/DQ; the gates pass ---------------------------------------
def test_fp16_keeps_rope_fp32_and_passes_its_gate(bundles, copy_bundle):
    import onnx

    from vitdeploy.bundle import Bundle
    from vitdeploy.exporters.fp16 import add_fp16_to_bundle, tensor_elem_types
    from vitdeploy.exporters.position_nodes import position_subgraph_nodes, rotary_application_nodes

    root = copy_bundle(bundles["dynamic"])
    fp32 = onnx.load(str(root / "model.onnx"))
    kept = set(rotary_application_nodes(fp32)) | set(position_subgraph_nodes(fp32))
    assert len(rotary_application_nodes(fp32)) >= 2 * 2 * 2  # 2 blocks x (q, k) x (cos mul, sin mul)
    add_fp16_to_bundle(Bundle.open(root))
    fp16 = onnx.load(str(root / "model.fp16.onnx"))
    elem_types = tensor_elem_types(fp16)
    checked = [n for n in fp16.graph.node if n.name in kept or n.op_type in ("Sin", "Cos")]
    assert any(n.op_type in ("Sin", "Cos") for n in checked)
    for node in checked:
        floats = [elem_types.get(t) for t in list(node.input) + list(node.output) if elem_types.get(t) in (1, 10)]
        assert all(t == onnx.TensorProto.FLOAT for t in floats), node.name
    record = Bundle.open(root).artifact_record("fp16")
    assert record["gate"]["passed"] and not record["gate"]["failures"]
    assert {k: v["cosine_p1"] >= 0.99 for k, v in record["gate"]["numbers"]["outputs"].items()} == {"embedding": True, "patch_grid": True}
    assert record["sanity"]["output"] == "embedding" and record["sanity"]["max_abs_logit_diff"] < 1e-2


def test_int8_calibrate_passes_its_gate_and_keeps_rope_out_of_qdq(bundles, copy_bundle, tmp_path):
    """A headless bundle is gated by calibrate on its embedding's cosine against fp32 (held-out photos), then
    `check` gates the INT8 graph again: 1st-percentile cosine of the embedding and the patch grid."""
    import onnx

    from vitdeploy.calibration.api import CalibrateOptions, calibrate_bundle
    from vitdeploy.checks import CheckOptions, run_check
    from vitdeploy.exporters.position_nodes import fp32_position_nodes

    root = copy_bundle(bundles["dynamic"])
    position = set(fp32_position_nodes(onnx.load(str(root / "model.onnx"))))
    assert position
    calib = tmp_path / "calib.npy"
    np.save(calib, real_photos(16, *NATIVE))
    held = tmp_path / "held.npy"
    np.save(held, real_photos(28, *NATIVE)[16:])
    record = calibrate_bundle(root, CalibrateOptions(data=str(calib), eval_data=str(held), method="minmax"))
    assert record["evaluation"]["gate"]["passed"] and record["evaluation"]["reference"]["scored"] == "embedding"
    report = run_check(root, CheckOptions(precisions=("int8",), random_count=8, write_report=False))
    assert report["passed"], report["failures"]
    int8 = onnx.load(str(root / "model.int8.onnx"))
    dq_consumers = dequantized_consumers(int8)
    assert dq_consumers and dq_consumers <= {"MatMul", "Gemm", "Conv"}
    assert dequantized_inputs(int8, position) == []  # no position node reads a dequantized tensor


def test_variable_size_is_refused_in_one_line(hub, tmp_path):
    from vitdeploy.exporters import ExportOptions, export

    with pytest.raises(UserError) as err:
        export(f"timm:{NAME}", tmp_path / "b", ExportOptions(model_kwargs=ARGS, variable_size=True, canvas=(128, 128)))
    assert "\n" not in str(err.value) and "normalised by each image's own grid" in str(err.value)
    assert not (tmp_path / "b").exists()


def test_manifest_names_the_rotary_rule(bundles):
    spec = json.loads(Path(bundles["static"].root, "manifest.json").read_text())["spec"]
    assert spec["position_kinds"] == ["rotary"] and spec["family"] == "dinov3"
    assert "2(i + 0.5)/G - 1" in spec["rotary"]["rule"] and "RotaryEmbeddingDinoV3" in spec["rotary"]["rule"]
