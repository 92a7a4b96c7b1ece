"""Issue 38: timm's NaFlexVit (``naflexvit_*``: SigLIP 2 NaFlex, C-RADIO, the GAP/MAP NaFlex ViTs) from an
offline timm hub cache, at a fixed size (square and not), with --dynamic-resolution and as a
variable-size bundle (images in a canvas + valid_hw), against timm's own forward on real photographs.

The models are two-block, 64-wide NaFlexVits with a 4x4 position table (native 64x64) and the rules
timm's named configurations use: bicubic antialiased (``_gap``), bilinear antialiased with a MAP head
(``_siglip``), factorized aspect-preserving (``_parfac_gap``), bilinear corner-aligned aspect-preserving
without antialias and a CLS read-out (``_radio_v3``). Position tables, the MAP probe, registers and
LayerScale get real values (timm initialises them near zero, which would hide position errors).
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from hf_cache import offline_hub, timm_hub_folder, write_folder, write_state_dict
from photos import photo_folder, real_photos

from vitdeploy.errors import UserError

pytestmark = pytest.mark.slow

SMALL = {"depth": 2, "embed_dim": 64, "num_heads": 2, "pos_embed_grid_size": (4, 4)}
# key: (timm architecture, hub repository of the tiny weights)
VARIANTS = {
    "gap": "naflexvit_base_patch16_gap",
    "map": "naflexvit_base_patch16_siglip",
    "parfac": "naflexvit_base_patch16_parfac_gap",
    "radio": "naflexvit_base_patch16_radio_v3",
}
PUBLISHED = "naflexvit_base_patch16_gap.e300_s576_in1k"  # timm:NAME.TAG, the weights under timm/NAME.TAG
LABELS = [f"class{i}" for i in range(5)]
NATIVE, TRAINED = (64, 64), (96, 96)  # the table's own grid; the weights' preprocessing size (pretrained_cfg)
CANVAS = (96, 128)


def _give_weight(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "pos_embed" in name or "latent" in name or "token" in name or name.startswith("head"):
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name.endswith("gamma"):
                p.fill_(0.5)
    return model.eval()


def _tiny(arch: str, num_classes: int = 5, seed: int = 0) -> torch.nn.Module:
    import timm

    torch.manual_seed(seed)
    return _give_weight(timm.create_model(arch, pretrained=False, num_classes=num_classes, **SMALL), seed)


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> dict:
    """HF_HOME with each variant as a timm hf-hub: repository (config.json: architecture, model_args, a
    96x96 pretrained_cfg with label names) and the published name's file under timm/NAME.TAG."""
    home = tmp_path_factory.mktemp("naflex-hub")
    models = {}
    for key, arch in VARIANTS.items():
        model = _tiny(arch)
        folder = timm_hub_folder(model, tmp_path_factory.mktemp(f"naflex-{key}"), {**SMALL, "num_classes": 5})
        config = json.loads((folder / "config.json").read_text())
        config["pretrained_cfg"].update(input_size=[3, *TRAINED], label_names=LABELS)
        (folder / "config.json").write_text(json.dumps(config))
        write_folder(home, f"test-org/naflex-{key}", folder)
        models[key] = model
    models["published"] = _tiny(VARIANTS["gap"], num_classes=1000, seed=1)  # timm's config: 1000 ImageNet classes, 384
    write_state_dict(home, f"timm/{PUBLISHED}", models["published"])
    return {"home": home, "models": models}


@pytest.fixture(scope="module")
def bundles(hub, tmp_path_factory) -> dict:
    """The exports every test below reads (each once): static at the trained size and non-square, dynamic, variable."""
    from vitdeploy.exporters import ExportOptions, export

    root = tmp_path_factory.mktemp("naflex-bundles")
    plan = {
        "published": (f"timm:{PUBLISHED}", {"model_kwargs": SMALL, "check_images": 8}),
        "map-static": ("timm:hf-hub:test-org/naflex-map", {"resolution": (64, 112), "check_images": 16}),
        "gap-dynamic": ("timm:hf-hub:test-org/naflex-gap", {"dynamic_resolution": True, "check_images": 8}),
        "map-variable": ("timm:hf-hub:test-org/naflex-map", {"variable_size": True, "canvas": CANVAS, "check_images": 16}),
    }
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        offline_hub(mp, hub["home"])
        for key, (source, options) in plan.items():
            out[key] = export(source, root / key, ExportOptions(**options))
    return out


def _timm_forward(model: torch.nn.Module, images: np.ndarray, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)) -> np.ndarray:
    """timm's own NaFlexVit forward on uint8 NHWC photos, normalised as its pretrained_cfg says."""
    from timm.models.naflexvit import NaFlexEmbeds

    assert type(model.embeds) is NaFlexEmbeds  # timm's class itself, not the adapter's export form
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0
    x = (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    with torch.no_grad():
        return model(x).numpy()


def _within_gate(got: np.ndarray, ref: np.ndarray) -> None:
    from vitdeploy.compare import reference_spread

    d = float(np.abs(got - ref).max())
    assert d <= 1e-4 and d <= 0.01 * reference_spread(ref), (d, reference_spread(ref))
    assert np.ptp(ref, axis=0).max() > 1e-2  # the photos really give different answers


def _ort(bundle, feeds) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(bundle.artifact_path("fp32")), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


# -- the position rule itself (no export) -----------------------------------------------------------
@pytest.mark.parametrize("key", list(VARIANTS))
def test_every_path_equals_timm_for_each_rule(key, hub):
    """Static (timm's table baked), dynamic (interpolation matrices) and the variable-size graph (each
    image's own table in one padded batch) = timm's forward at each size, shrinking (antialias) included."""
    from vitdeploy.exporters.adapters import timm_adapter
    from vitdeploy.exporters.loaded import LoadedModel
    from vitdeploy.exporters.variable_size import VariableSizeGraph
    from vitdeploy.posembed import PosEmbedInterpolation

    model = hub["models"][key]
    exported = copy.deepcopy(model)  # the adapter gives its embeds the export form; the reference stays timm's
    adapter = timm_adapter(exported, VARIANTS[key])
    loaded = LoadedModel(exported, adapter.spec(exported, VARIANTS[key]), {}, LABELS, {"kind": "timm", "name": VARIANTS[key]},
                         adapter=adapter)
    dynamic, _ = adapter.make_dynamic(loaded, None)
    sizes = [(64, 64), (48, 112), (96, 32), (128, 96), (16, 16)]
    graph = VariableSizeGraph(loaded, {"mean": [0.5] * 3, "std": [0.5] * 3, "channel_order": "rgb"}, (128, 112),
                              PosEmbedInterpolation()).eval()
    canvas = np.zeros((len(sizes), 128, 112, 3), np.uint8)
    alone = []
    for b, (h, w) in enumerate(sizes):
        photos = real_photos(2, h, w)
        ref = _timm_forward(model, photos)
        x = (torch.from_numpy(photos).permute(0, 3, 1, 2).float() / 255.0 - 0.5) / 0.5
        with torch.no_grad():
            assert np.abs(adapter.regrid_static(loaded, h, w, None)(x).numpy() - ref).max() <= 1e-5, (h, w)
            assert np.abs(dynamic(x).numpy() - ref).max() <= 1e-5, (h, w)
        canvas[b, :h, :w] = photos[0]
        alone.append(ref[0])
    with torch.no_grad():
        padded, _ = graph(torch.from_numpy(canvas), torch.tensor(sizes, dtype=torch.int32))
    assert np.abs(padded.numpy() - np.stack(alone)).max() <= 1e-4
    assert np.ptp(np.stack(alone), axis=0).max() > 1e-2


def test_interpolation_matrices_equal_torch_interpolate():
    import itertools

    import torch.nn.functional as F

    from vitdeploy.exporters.adapters.timm_naflex_positions import axis_weights

    gen = torch.Generator().manual_seed(0)
    for mode, corners, aa in itertools.product(("bilinear", "bicubic"), (False, True), (False, True)):
        for old, new in (((4, 4), (2, 7)), ((7, 5), (13, 3)), ((16, 16), (24, 9)), ((3, 4), (1, 1))):
            table = torch.randn(1, 6, *old, generator=gen)
            ref = F.interpolate(table, size=new, mode=mode, align_corners=corners, antialias=aa)[0]
            w_h = axis_weights(old[0], torch.tensor(float(new[0])), new[0], mode, corners, aa)
            w_w = axis_weights(old[1], torch.tensor(float(new[1])), new[1], mode, corners, aa)
            assert (torch.einsum("ih,chw,jw->cij", w_h, table[0], w_w) - ref).abs().max() <= 2e-5, (mode, corners, aa, old, new)


# -- what the loader reads, refuses, counts --------------------------------------------------------------
def test_spec_costs_and_module_names(hub):
    from vitdeploy.costs import param_count
    from vitdeploy.exporters.adapters import timm_adapter

    model = copy.deepcopy(hub["models"]["map"])  # SigLIP-style: no LayerScale, no prefix tokens, a MAP head
    adapter = timm_adapter(model, VARIANTS["map"])
    spec = adapter.spec(model, VARIANTS["map"])
    assert spec.image_size == NATIVE and spec.global_pool == "map" and spec.num_prefix_tokens == 0
    (term,) = spec.extra_terms
    assert term["name"] == "map-head" and term["params"] == sum(p.numel() for p in model.attn_pool.parameters())
    assert param_count(spec) == sum(p.numel() for p in model.parameters())
    d, length = spec.embed_dim, spec.seq_len()
    counted = d * d + 2 * d * d * length + 2 * d * length + d * d + 2 * model.attn_pool.mlp.fc1.out_features * d
    assert sum(c * length ** i for i, c in enumerate(term["macs"])) == counted  # q, kv of L tokens, q.k and a.v, proj, MLP
    gap = copy.deepcopy(hub["models"]["gap"])
    gap_spec = timm_adapter(gap, VARIANTS["gap"]).spec(gap, VARIANTS["gap"])
    assert gap_spec.num_reg_tokens == 4 and gap_spec.global_pool == "avg" and not gap_spec.extra_terms
    radio = copy.deepcopy(hub["models"]["radio"])
    assert timm_adapter(radio, VARIANTS["radio"]).spec(radio, VARIANTS["radio"]).global_pool == "token"
    parfac = copy.deepcopy(hub["models"]["parfac"])
    parfac_spec = timm_adapter(parfac, VARIANTS["parfac"]).spec(parfac, VARIANTS["parfac"])
    assert "factorized" in parfac_spec.extra["position_rule"] and not parfac_spec.abs_pos_embed


@pytest.mark.parametrize("overrides, message", [
    ({"rope_type": "axial"}, "rotary positions"),
    ({"dynamic_img_pad": True}, "dynamic_img_pad"),
    ({"global_pool": "avgmax"}, "global_pool='avgmax'"),
])
def test_what_is_out_of_reach_is_one_line(overrides, message):
    import timm

    from vitdeploy.exporters.adapters import timm_adapter

    with torch.device("meta"):
        model = timm.create_model(VARIANTS["gap"], pretrained=False, **SMALL, **overrides)
    with pytest.raises(UserError) as err:
        timm_adapter(model, VARIANTS["gap"])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_variable_size_of_a_headless_encoder_is_one_line():
    """The published SigLIP 2 NaFlex encoders have no classifier; the variable-size graph returns class scores."""
    from vitdeploy.exporters.adapters import timm_adapter
    from vitdeploy.exporters.loaded import LoadedModel

    model = _tiny(VARIANTS["map"], num_classes=0)
    adapter = timm_adapter(model, VARIANTS["map"])
    loaded = LoadedModel(model, adapter.spec(model, VARIANTS["map"]), {}, [], {"kind": "timm", "name": VARIANTS["map"]}, adapter=adapter)
    with pytest.raises(UserError) as err:
        adapter.variable_parts(loaded)
    assert "no classification head" in str(err.value) and "--dynamic-resolution" in str(err.value) and "\n" not in str(err.value)


# -- static ------------------------------------------------------------------------------------------------
def test_published_name_exports_at_its_preprocessing_size(bundles, hub):
    """timm:NAME.TAG from the cache: exported at the weight's 384x384 (its pretrained_cfg), the 4x4 table
    baked by timm's rule; = timm's forward on photos; check passes; the manifest names the rule."""
    bundle = bundles["published"]
    assert bundle.resolution["mode"] == "static" and (bundle.resolution["height"], bundle.resolution["width"]) == (384, 384)
    assert bundle.resolution["native"] == list(NATIVE) and bundle.labels[0].startswith("tench")  # timm's ImageNet names
    assert "antialiased" in bundle.spec.extra["position_rule"]
    photos = real_photos(6, 384, 384)
    got = _ort(bundle, {"images": photos})["logits"]
    cfg = hub["models"]["published"].pretrained_cfg
    _within_gate(got, _timm_forward(hub["models"]["published"], photos, cfg["mean"], cfg["std"]))


def test_static_non_square_map_head(bundles, hub, tmp_path, monkeypatch):
    from vitdeploy.checks import CheckOptions, run_check

    bundle = bundles["map-static"]
    photos = real_photos(6, 64, 112)
    _within_gate(_ort(bundle, {"images": photos})["logits"], _timm_forward(hub["models"]["map"], photos))
    assert bundle.labels == LABELS and "attn_pool" in bundle.manifest["graph"]["module_outputs"]
    offline_hub(monkeypatch, hub["home"])
    report = run_check(bundle.root, CheckOptions(random_count=8, write_report=False))
    assert report["passed"], report["failures"]


def test_fp16_int8_and_the_map_head_as_a_role(bundles, copy_bundle, tmp_path, monkeypatch, hub):
    import onnx

    from vitdeploy.bundle import Bundle
    from vitdeploy.calibration.api import CalibrateOptions, calibrate_bundle
    from vitdeploy.calibration.precision_units import int8_units
    from vitdeploy.exporters.fp16 import add_fp16_to_bundle

    root = copy_bundle(bundles["map-static"])
    units = int8_units(onnx.load(str(root / "model.onnx")), Bundle.open(root).manifest["graph"])
    cells = [u.name for u in units["cells"]]
    assert {"attn_pool/qkv", "attn_pool/attention-matmuls", "attn_pool/mlp-fc1"} <= set(cells), cells
    assert "patch_embed" in cells  # the patch Linear runs as the equal Conv: the patch-embed role every ViT has
    offline_hub(monkeypatch, hub["home"])
    add_fp16_to_bundle(Bundle.open(root))
    assert Bundle.open(root).artifact_record("fp16")["sanity"]["top1_agreement"] == 1.0
    data = tmp_path / "calib.npy"
    np.save(data, real_photos(16, 64, 112))
    held = tmp_path / "held.npy"
    np.save(held, real_photos(32, 64, 112)[16:])
    record = calibrate_bundle(root, CalibrateOptions(data=str(data), eval_data=str(held), method="minmax"))
    assert record["evaluation"]["gate"]["passed"], record["evaluation"]["gate"]  # agreement and cosine vs fp32, held-out photos
    assert (root / "model.int8.onnx").is_file()


# -- dynamic ---------------------------------------------------------------------------------------------
def test_dynamic_antialiased_rule_in_graph_equals_timm(bundles, hub, copy_bundle, monkeypatch):
    """The bicubic antialiased rule (timm's default) computed in the graph by matrices: no Resize node,
    = timm at the native, trained and a shrinking non-square size; lint-clean for TensorRT 10/11, 8.6 lowered."""
    import onnx
    from click.testing import CliRunner

    from vitdeploy.cli import main

    bundle = bundles["gap-dynamic"]
    assert not [n for n in onnx.load(str(bundle.artifact_path("fp32"))).graph.node if n.op_type == "Resize"]
    sizes = [(s["height"], s["width"]) for s in bundle.manifest["records"]["export_check"]["sizes"]]
    assert any(h != w for h, w in sizes)
    for size in (NATIVE, TRAINED, (48, 112), (160, 96)):
        photos = real_photos(4, *size)
        _within_gate(_ort(bundle, {"images": photos})["logits"], _timm_forward(hub["models"]["gap"], photos))
    from vitdeploy.checks import CheckOptions, run_check

    offline_hub(monkeypatch, hub["home"])
    report = run_check(bundle.root, CheckOptions(random_count=8, write_report=False))
    assert report["passed"], report["failures"]
    root = copy_bundle(bundle)
    for version in ("10.3", "11.4", "8.6"):
        res = CliRunner().invoke(main, ["build-engine", str(root), "--dry-run", "--trt-version", version,
                                        "--resolution", "32:96:160", "--precision", "fp32"])
        assert res.exit_code == 0 and "nothing it cannot parse" in res.output, res.output


# -- variable size -------------------------------------------------------------------------------------
def test_variable_rows_equal_timm_on_each_image_alone(bundles, hub, monkeypatch):
    from vitdeploy.checks import CheckOptions, run_check
    from vitdeploy.variable import pad_to_canvas

    bundle = bundles["map-variable"]
    record = bundle.manifest["records"]["export_check"]
    assert record["passed"], record["failures"]
    sizes = [(96, 128), (64, 64), (32, 112), (80, 16), (48, 48)]
    crops = [real_photos(1, h, w)[0] for h, w in sizes]
    batch, valid = pad_to_canvas(crops, CANVAS, fill=128)
    padded = _ort(bundle, {"images": batch, "valid_hw": valid})["logits"]
    alone = np.concatenate([_timm_forward(hub["models"]["map"], crop[None]) for crop in crops])  # timm itself, each alone
    _within_gate(padded, alone)
    offline_hub(monkeypatch, hub["home"])  # `check` reloads the model from the cache, as a user's would
    report = run_check(bundle.root, CheckOptions(random_count=8, write_report=False))
    assert report["passed"], report["failures"]


def test_variable_fp16_and_int8_keep_the_mask_path_float(bundles, copy_bundle, tmp_path, monkeypatch, hub):
    """NaFlex's per-image tables are built from valid_hw: the whole build stays fp32 (no Shape read pulls a
    mask tensor into fp16) and out of Q/DQ; both passes run their invariance gates on padded batches."""
    import onnx

    from vitdeploy.bundle import Bundle
    from vitdeploy.calibration.api import CalibrateOptions, calibrate_bundle
    from vitdeploy.exporters.fp16 import add_fp16_to_bundle
    from vitdeploy.exporters.mask_path import find_mask_path

    root = copy_bundle(bundles["map-variable"])
    graph = onnx.load(str(root / "model.onnx"))
    mask = find_mask_path(graph)
    assert len(mask.nodes) > 50 and not [n for n in graph.graph.node if n.op_type == "Shape" and n.input[0] in mask.tensors]
    offline_hub(monkeypatch, hub["home"])
    add_fp16_to_bundle(Bundle.open(root))
    assert Bundle.open(root).artifact_record("fp16")
    data = tmp_path / "calib.npy"
    np.save(data, real_photos(16, *NATIVE))
    calibrate_bundle(root, CalibrateOptions(data=str(data), method="minmax"))
    int8 = onnx.load(str(root / "model.int8.onnx"))
    qdq = {n.output[0] for n in int8.graph.node if n.op_type == "DequantizeLinear"}
    assert not [n for n in int8.graph.node if n.name in set(mask.linear) and set(n.input) & qdq]


def test_predict_evaluate_take_the_variable_bundle(bundles, hub, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from vitdeploy.cli import main
    from vitdeploy.runtime.classifier import predict_files

    bundle = bundles["map-variable"]
    files = sorted(photo_folder(tmp_path / "photos", 4, 80, 48).glob("*.png")) + sorted(photo_folder(tmp_path / "wide", 2, 48, 160).glob("*.png"))
    results, about = predict_files(bundle, files, top_k=5, prefer=("onnxruntime",))
    assert about["canvas"] == list(CANVAS) and len(results) == len(files)
    labelled = tmp_path / "labelled"
    for i, label in enumerate(LABELS[:2]):
        photo_folder(labelled / label, 3, 64 + 16 * i, 96)
    offline_hub(monkeypatch, hub["home"])
    res = CliRunner().invoke(main, ["evaluate", str(bundle.root), "--data", str(labelled), "--suite", "none", "--threads", "1",
                                    "--no-plot", "-o", str(tmp_path / "eval"), "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    assert report["bundle"]["input"]["kind"] == "canvas" and report["data"]["count"] == 6
    assert report["results"]["onnx fp32"]["clean"]["agreement"] == 1.0


def test_serve_answers_one_request_like_predict(bundles, tmp_path):
    import tritonclient.http as httpclient

    from vitdeploy.contract import InputContract
    from vitdeploy.errors import VitDeployError
    from vitdeploy.runtime.classifier import predict_files
    from vitdeploy.serve.launcher import check_serve_python, resolve_serve_python
    from vitdeploy.serve.process import ServeProcess

    try:
        check_serve_python(*resolve_serve_python())
    except VitDeployError as exc:
        pytest.fail(f"the serve environment is missing, so `vitdeploy serve` cannot be tested: {exc}", pytrace=False)
    bundle = bundles["map-variable"]
    files = sorted(photo_folder(tmp_path / "photos", 3, 80, 112).glob("*.png"))
    results, _ = predict_files(bundle, files, top_k=5, prefer=("onnxruntime",))
    expected = np.array([[dict((t["label"], t["prob"]) for t in r["top"])[label] for label in bundle.labels] for r in results])
    contract = InputContract.from_bundle(bundle)
    feeds = contract.feeds([contract.prepare(str(p)) for p in files])
    proc = ServeProcess(bundle.root, ["--max-batch", "4", "--threads", "1"], log_path=tmp_path / "server.log")
    proc.start()
    try:
        with httpclient.InferenceServerClient(proc.http_url, network_timeout=60) as client:
            inputs = [httpclient.InferInput("images", list(feeds["images"].shape), "UINT8"),
                      httpclient.InferInput("valid_hw", list(feeds["valid_hw"].shape), "INT32")]
            inputs[0].set_data_from_numpy(feeds["images"])
            inputs[1].set_data_from_numpy(feeds["valid_hw"])
            probs = client.infer(proc.model_name, inputs).as_numpy("probs")
    finally:
        proc.stop()
    np.testing.assert_allclose(probs, expected, atol=1e-5)
