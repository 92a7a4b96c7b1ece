"""Issue 38, timm MAP-head ViTs (SigLIP: ``global_pool='map'``, ``model.attn_pool``): the TimmMapViT adapter.

Two published timm names load from a real, offline Hugging Face cache written here (tests/hf_cache.py),
as timm:NAME.TAG with the architecture cut down by --model-arg (depth 2, width 64/72) so the exports
stay cheap: the SigLIP WebLI tower (no head: an embedding model) and the ImageNet fine-tune of
SigLIP so400m/14 (a 1000-class head; its real MLP ratio 3.7362). The weights are seeded far from
timm's init: the MAP probe (latent), the position table and the heads get real values.

Parity is against timm's own model (timm.create_model from the same cache, its own pretrained_cfg
mean/std; set_input_size for a static size, dynamic_img_size for a dynamic graph) on real photos
(tests/photos.py), with the export gate's bounds: max |d| <= 1e-4 and <= 1% of the reference spread.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hf_cache import offline_hub, write_state_dict
from photos import real_photos

from vitdeploy.compare import reference_spread
from vitdeploy.errors import UserError
from vitdeploy.posembed import PosEmbedInterpolation
from vitdeploy.runtime.ort import OrtRunner

pytestmark = pytest.mark.slow

TOWER = "vit_base_patch16_siglip_224.webli"  # published without a head (num_classes 0)
TOWER_ARGS = {"depth": 2, "embed_dim": 64, "num_heads": 2, "img_size": 96}
CLASSIFIER = "vit_so400m_patch14_siglip_378.webli_ft_in1k"  # published with an ImageNet-1k head
CLASSIFIER_ARGS = {"depth": 2, "embed_dim": 72, "num_heads": 2, "img_size": 84}
ALL = ("logits", "probs", "embedding", "patch_grid")
TIMM_RESIZE = PosEmbedInterpolation(antialias=True)  # timm's resample_abs_pos_embed (bicubic, antialias=True)


def _trained_like(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Real values where timm initialises small: the MAP probe, the position table, the pool's output layers, the head."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in ("attn_pool.latent", "pos_embed"):
                p.copy_(torch.randn(p.shape, generator=gen) * (1.0 if name == "attn_pool.latent" else 0.5))
            elif name.startswith(("head.", "attn_pool.proj.", "attn_pool.mlp.fc2.")) and name.endswith("weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
            elif p.dim() >= 2:
                p.add_(torch.randn(p.shape, generator=gen) * 0.02)
            elif name.endswith("norm.weight") or ".norm1." in name or ".norm2." in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
    return model.eval()


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> dict:
    import timm

    home = tmp_path_factory.mktemp("hf-home-map")
    for i, (name, args) in enumerate(((TOWER, TOWER_ARGS), (CLASSIFIER, CLASSIFIER_ARGS))):
        classes = timm.models.get_pretrained_cfg(name).num_classes  # as published: 0 (the tower) or 1000
        torch.manual_seed(10 + i)  # timm's own init draws from the global generator: the same weights every run
        model = _trained_like(timm.create_model(name.split(".")[0], pretrained=False, num_classes=classes, **args), seed=10 + i)
        write_state_dict(home, f"timm/{name}", model)
    return {"home": home}


@pytest.fixture(autouse=True)
def _offline(hub, monkeypatch):
    offline_hub(monkeypatch, hub["home"])


def _timm(name: str, args: dict, **extra) -> torch.nn.Module:
    """timm's own model, from the same offline cache, as a user of timm would build it."""
    import timm

    return timm.create_model(name, pretrained=True, **args, **extra).eval()


def _timm_outputs(model: torch.nn.Module, images: np.ndarray) -> dict[str, np.ndarray]:
    """timm's forward with its own pretrained_cfg normalisation: logits, the MAP embedding, the patch grid."""
    from timm.data import resolve_model_data_config
    from torchvision.transforms import Normalize

    cfg = resolve_model_data_config(model)
    x = Normalize(cfg["mean"], cfg["std"])(torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0)
    gh, gw = x.shape[-2] // model.patch_embed.patch_size[0], x.shape[-1] // model.patch_embed.patch_size[1]
    with torch.no_grad():
        tokens = model.forward_features(x)
        out = {"embedding": model.forward_head(tokens, pre_logits=True),
               "patch_grid": tokens[:, model.num_prefix_tokens:].reshape(len(x), gh, gw, -1).permute(0, 3, 1, 2)}
        if model.num_classes:
            out["logits"] = model(x)
    return {k: v.numpy() for k, v in out.items()}


def _assert_matches_timm(bundle, model: torch.nn.Module, height: int, width: int) -> None:
    images = real_photos(8, height, width)
    want = _timm_outputs(model, images)
    with OrtRunner(bundle.artifact_path("fp32")) as runner:
        got = runner.run({"images": images})
    names = [n for n in ("logits", "embedding", "patch_grid") if n in got]
    assert names and set(names) <= set(want)
    for name in names:
        diff = float(np.abs(got[name] - want[name]).max())
        spread = reference_spread(want[name])
        assert diff <= 1e-4 and diff <= 0.01 * spread, f"{name} at {height}x{width}: max |d| {diff:.2e}, spread {spread:.2e}"
    if "logits" in got:
        assert (got["logits"].argmax(1) == want["logits"].argmax(1)).all()


@pytest.fixture(scope="module")
def bundles(hub, export_cached) -> dict:
    """The exports every test reads (cached per run): built inside the offline hub."""
    with pytest.MonkeyPatch.context() as mp:
        offline_hub(mp, hub["home"])
        return {
            "dynamic": export_cached(f"timm:{CLASSIFIER}", model_kwargs=CLASSIFIER_ARGS, dynamic_resolution=True, outputs=ALL,
                                     check_images=16),
            "static": export_cached(f"timm:{CLASSIFIER}", model_kwargs=CLASSIFIER_ARGS, resolution=(84, 140), outputs=ALL,
                                    interpolation=TIMM_RESIZE, check_images=16),
            "tower": export_cached(f"timm:{TOWER}", model_kwargs=TOWER_ARGS, dynamic_resolution=True, interpolation=TIMM_RESIZE,
                                   check_images=16),
        }


# -- the adapter, the spec and the cost model ------------------------------------------------------
def test_adapter_claims_map_models_and_leaves_gap_and_eva_alone():
    import timm

    from vitdeploy.exporters.adapters import timm_adapter

    with torch.device("meta"):
        siglip = timm.create_model("vit_base_patch16_siglip_224", depth=1)
        gap = timm.create_model("vit_base_patch16_siglip_gap_224", depth=1)
        regs = timm.create_model("vit_so150m_patch16_reg4_map_256", depth=1)
        pe = timm.create_model("vit_pe_core_tiny_patch16_384", depth=1)  # timm's Eva with a MAP head: not this adapter
    assert type(timm_adapter(siglip, "siglip")).__name__ == "TimmMapViT"
    assert type(timm_adapter(regs, "so150m")).__name__ == "TimmMapViT"
    assert type(timm_adapter(gap, "siglip_gap")).__name__ == "TimmViT"  # the GAP variants are plain timm ViTs
    spec = timm_adapter(siglip, "siglip").spec(siglip, "siglip")
    assert spec.global_pool == "map" and not spec.class_token and spec.num_prefix_tokens == 0 and spec.architecture == "vit-map"
    assert timm_adapter(gap, "g").spec(gap, "g").global_pool == "avg"
    assert timm_adapter(regs, "r").spec(regs, "r").num_reg_tokens == 4
    with pytest.raises(UserError, match="global_pool='map'") as err:
        timm_adapter(pe, "vit_pe_core_tiny_patch16_384").spec(pe, "vit_pe_core_tiny_patch16_384")
    assert "\n" not in str(err.value)


def test_a_map_head_with_its_own_position_table_is_refused_in_one_line():
    import timm
    from timm.layers import AttentionPoolLatent

    from vitdeploy.exporters.adapters import timm_adapter

    model = timm.create_model("vit_base_patch16_siglip_224", depth=1, embed_dim=64, num_heads=2, img_size=64)
    model.attn_pool = AttentionPoolLatent(64, num_heads=2, pos_embed="abs", feat_size=16, norm_layer=torch.nn.LayerNorm)
    with pytest.raises(UserError, match="position table inside its attention-pool head") as err:
        timm_adapter(model, "custom")
    assert "\n" not in str(err.value)
    model.attn_pool = AttentionPoolLatent(64, num_heads=2, pool_type="", norm_layer=torch.nn.LayerNorm)  # [B, 1, d] out
    with pytest.raises(UserError, match="unreduced") as err:
        timm_adapter(model, "custom")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name,args,size", [
    ("vit_base_patch16_siglip_224", TOWER_ARGS, (80, 128)),
    ("vit_so400m_patch14_siglip_378", {**CLASSIFIER_ARGS, "num_classes": 10}, (84, 140)),
    ("vit_so150m_patch16_reg4_map_256", {"depth": 2, "embed_dim": 64, "num_heads": 2, "img_size": 64}, (64, 96)),
])
def test_cost_terms_equal_a_parameter_and_mac_count(name, args, size):
    """params = timm's parameter count; MACs (the head's term and the total) = torch's FLOP counter / 2 at the
    native and a non-square size (attention computed unfused, so its matmuls are counted)."""
    import timm
    from torch.utils.flop_counter import FlopCounterMode

    from vitdeploy.costs import vit_costs
    from vitdeploy.exporters.adapters import timm_adapter

    model = timm.create_model(name, dynamic_img_size=True, **args).eval()
    for module in model.modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = False
    spec = timm_adapter(model, name).spec(model, name)
    (term,) = spec.extra_terms
    assert term["params"] == sum(p.numel() for p in model.attn_pool.parameters())
    assert vit_costs(spec).params == sum(p.numel() for p in model.parameters())
    for height, width in (spec.image_size, size):
        x = torch.randn(1, 3, height, width)
        tokens = model.forward_features(x)[:, model.num_prefix_tokens:].detach()
        with FlopCounterMode(display=False) as head:  # outside no_grad: torch's module tracker hooks autograd
            model.attn_pool(tokens)
        with FlopCounterMode(display=False) as whole:
            model(x)
        report = vit_costs(spec, height, width)
        assert report.macs_extra == head.get_total_flops() // 2 > 0
        assert report.macs_total == whole.get_total_flops() // 2


# -- exports against timm's own forward -----------------------------------------------------------
def test_dynamic_classifier_matches_timm_at_the_native_size_and_checks(bundles):
    from vitdeploy.checks import CheckOptions, run_check

    bundle = bundles["dynamic"]
    record = bundle.manifest["records"]["export_check"]
    assert record["passed"] and len(record["sizes"]) >= 3 and any(s["height"] != s["width"] for s in record["sizes"])
    spec = bundle.manifest["spec"]
    assert spec["global_pool"] == "map" and spec["extra_terms"][0]["name"] == "map-head" and spec["num_prefix_tokens"] == 0
    details = bundle.manifest["graph"]["output_details"]
    assert details["embedding"]["readout"] == "map" and "attention-pool (MAP)" in details["embedding"]["reference"]
    assert details["patch_grid"]["shape"] == ["batch", 72, "grid_h", "grid_w"]
    assert len(bundle.manifest["labels"]) == 1000  # the published ImageNet head keeps its names
    # no resampling at the native size: the graph is timm's own dynamic_img_size model there
    _assert_matches_timm(bundle, _timm(CLASSIFIER, CLASSIFIER_ARGS, dynamic_img_size=True), 84, 84)
    report = run_check(bundle.root, CheckOptions(random_count=8, write_report=False, localise="always"))
    assert report["passed"], report["failures"]
    # check's localisation compares the MAP head's own output (timm's attn_pool) with its graph tensor
    local = next(a for a in report["artifacts"] if a["precision"] == "fp32")["localisation"]
    rows = {row["module"]: row for row in local["modules"]}
    assert local["first_divergence"] is None and list(rows)[-2:] == ["attn_pool", "head"]
    assert rows["attn_pool"]["cosine_min"] > 0.99999


def test_static_non_square_matches_timm_set_input_size(bundles):
    bundle = bundles["static"]
    assert bundle.manifest["records"]["export_check"]["passed"]
    reference = _timm(CLASSIFIER, CLASSIFIER_ARGS)
    reference.set_input_size(img_size=(84, 140))  # timm's own resize of the table (antialiased bicubic, as exported)
    _assert_matches_timm(bundle, reference, 84, 140)


def test_tower_is_an_embedding_model_matching_timm_dynamic_img_size(bundles):
    from vitdeploy.checks import CheckOptions, run_check

    bundle = bundles["tower"]
    assert bundle.manifest["graph"]["outputs"] == ["embedding", "patch_grid"] and bundle.manifest["labels"] == []
    timm_model = _timm(TOWER, TOWER_ARGS, dynamic_img_size=True)
    for height, width in ((96, 96), (96, 160)):  # native; non-square through timm's in-forward resample
        _assert_matches_timm(bundle, timm_model, height, width)
    report = run_check(bundle.root, CheckOptions(random_count=8, write_report=False))
    assert report["passed"], report["failures"]


# -- TensorRT lint, precisions, the MAP head's roles -------------------------------------------------
def test_build_engine_lint_passes_for_trt_10_11_and_8x_after_lowering(bundles):
    from click.testing import CliRunner

    from vitdeploy.cli import main

    for version in ("10.3", "11.0", "8.6", "8.5"):
        result = CliRunner().invoke(main, ["build-engine", str(bundles["dynamic"].root), "--dry-run", "--lint", "--trt-version", version,
                                           "--resolution", "56:84:140", "--precision", "fp32"])
        assert result.exit_code == 0, f"{version}: {result.output}"
        assert "nothing it cannot parse" in result.output or "every finding is rewritten by the lowering" in result.output
    # timm's exact resize (antialiased) in a dynamic graph is what TensorRT's parser cannot read: the lint says so
    result = CliRunner().invoke(main, ["build-engine", str(bundles["tower"].root), "--dry-run", "--lint", "--trt-version", "10.3",
                                       "--resolution", "32:96:160", "--precision", "fp32"])
    assert result.exit_code != 0 and "Resize antialias=1" in result.output


def test_debug_precision_units_and_exclusions_name_the_map_head(bundles):
    import onnx

    from vitdeploy.calibration.exclusions import Exclusions, resolve
    from vitdeploy.calibration.precision_units import fp16_units, int8_units

    bundle = bundles["dynamic"]
    graph = bundle.manifest["graph"]
    assert list(graph["module_outputs"])[-2:] == ["attn_pool", "head"]
    model = onnx.load(str(bundle.artifact_path("fp32")))
    map_cells = {"attn_pool/qkv", "attn_pool/attention-matmuls", "attn_pool/attn-proj", "attn_pool/mlp-fc1", "attn_pool/mlp-fc2"}
    for units in (int8_units(model, graph), fp16_units(model, graph)):
        cells = {u.name: u for u in units["cells"]}
        assert map_cells <= set(cells) and cells["head"].layers == 1  # the classifier alone, not the pool's layers
        assert "attn_pool" in {u.name for u in units["blocks"]}
        assert not [n for n in cells if n.startswith("head/")]  # the pool is computed once, and named
    kept = resolve(model, graph, Exclusions(blocks=("attn_pool/attention-matmuls",)))["nodes"]
    assert len(kept) == 2  # q.k^T and attn.v of the latent query


def test_fp16_and_int8_pass_their_gates(bundles, copy_bundle, tmp_path):
    from vitdeploy.bundle import Bundle
    from vitdeploy.calibration.api import CalibrateOptions, calibrate_bundle
    from vitdeploy.exporters.fp16 import add_fp16_to_bundle

    root = copy_bundle(bundles["dynamic"])
    views = real_photos(32, 84, 84)
    data, held_out = tmp_path / "calib.npy", tmp_path / "held_out.npy"
    np.save(data, views[:16])
    np.save(held_out, views[16:])  # unlabelled: the gates are agreement and cosine with the fp32 graph
    add_fp16_to_bundle(Bundle.open(root), data=str(data), eval_data=str(held_out))  # gated: CheckFailed if it fails
    sanity = Bundle.open(root).artifact_record("fp16")["sanity"]
    assert sanity["top1_agreement"] == 1.0
    # calibrate as a user would: the ladder (methods, smoothing, exclusions) until a recipe is inside the gate
    record = calibrate_bundle(root, CalibrateOptions(data=str(data), eval_data=str(held_out)))
    assert (root / "model.int8.onnx").is_file()
    gate = record["evaluation"]["gate"]  # a graph below it raises CheckFailed and is not written
    assert gate["passed"] and not gate["failures"], gate


# -- variable size: the MAP head's attention under the key mask ----------------------------------------
def test_variable_size_padded_rows_equal_each_image_alone(export_cached, copy_bundle):
    from vitdeploy.bundle import Bundle
    from vitdeploy.exporters.fp16 import add_fp16_to_bundle

    bundle = export_cached(f"timm:{CLASSIFIER}", model_kwargs=CLASSIFIER_ARGS, variable_size=True, canvas=(112, 112))
    record = bundle.manifest["records"]["export_check"]
    assert record["passed"], record["failures"]
    assert "attn_pool" in bundle.manifest["graph"]["module_outputs"]
    # fp16 keeps the pool's key bias (computed from valid_hw) in fp32 and passes the invariance sanity
    root = copy_bundle(bundle)
    add_fp16_to_bundle(Bundle.open(root))  # CheckFailed if the padded rows drift from each image alone
    assert (root / "model.fp16.onnx").is_file()


def test_variable_size_refuses_a_headless_tower_in_one_line_and_writes_nothing(tmp_path):
    from vitdeploy.exporters import ExportOptions, export

    out = tmp_path / "tower-variable"
    with pytest.raises(UserError, match="no classification head") as err:  # refused after loading, before the export
        export(f"timm:{TOWER}", out, ExportOptions(model_kwargs=TOWER_ARGS, variable_size=True, canvas=(96, 96)))
    assert "\n" not in str(err.value) and not out.exists()


def test_the_key_mask_is_what_makes_the_pool_invariant():
    """Padded keys change an unmasked pool; masked, the padded row pools exactly what the image alone pools."""
    import timm

    from vitdeploy.exporters.adapters.timm_map import TimmMapParts

    torch.manual_seed(3)
    model = _trained_like(timm.create_model("vit_base_patch16_siglip_224", num_classes=5, **TOWER_ARGS), seed=3)
    parts = TimmMapParts(model)
    alone = torch.randn(1, 9, 64)  # a 3x3 grid's final tokens
    padded = torch.cat([alone, torch.randn(1, 7, 64)], dim=1)
    valid = torch.tensor([[True] * 9 + [False] * 7])
    with torch.no_grad():
        want = model.forward_head(alone)
        assert torch.allclose(parts.head(padded, valid), want, atol=1e-6)
        assert not torch.allclose(parts.head(padded, torch.ones_like(valid)), want, atol=1e-3)


def test_debug_precision_ranks_the_map_head_as_a_block_and_its_cells(bundles, copy_bundle, tmp_path):
    from vitdeploy.calibration.debug_precision import DebugOptions, debug_precision
    from vitdeploy.runtime.ort import OrtRunner

    root = copy_bundle(bundles["dynamic"])
    views = real_photos(32, 84, 84)
    with OrtRunner(root / "model.onnx") as runner:  # labels: the fp32 graph's own classes (random-init weights)
        labels = runner.infer(views[16:])["logits"].argmax(1)
    np.save(tmp_path / "calib.npy", views[:16])
    np.savez(tmp_path / "eval.npz", images=views[16:], labels=labels)
    report = debug_precision(root, DebugOptions(precision="int8", data=str(tmp_path / "calib.npy"), eval_data=str(tmp_path / "eval.npz"),
                                                method="minmax"))
    cells = {row["unit"] for row in report["ranking"]["cells"]}
    assert {"attn_pool/qkv", "attn_pool/attention-matmuls", "attn_pool/attn-proj", "attn_pool/mlp-fc1", "attn_pool/mlp-fc2"} <= cells
    assert "attn_pool" in {row["unit"] for row in report["ranking"]["blocks"]}
    assert all(row["damage"] >= 0 for row in report["ranking"]["cells"])
