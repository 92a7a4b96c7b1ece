"""Issue 38, transformers' image towers (exporters/adapters/hf_clip.py, hf_siglip.py): CLIP, SigLIP and SigLIP 2.

The hub repositories are written as users find them published, in a real offline Hugging Face cache: the dual
encoders (``CLIPModel``, ``SiglipModel``, ``Siglip2Model``) with their own image processors, and the
classifiers (``CLIPForImageClassification``, ``SiglipForImageClassification``,
``Siglip2ForImageClassification``) with id2label. A dual encoder exports its IMAGE tower: CLIP's with its
projection (``image_embeds``), SigLIP's attention-pool head output (``pooler_output``).

Parity is against transformers itself: each model loaded again from the cache folder as its class, on
real photographs (tests/photos.py) through its own image processor with resizing off, at the trained size and
at another size (dynamic graphs: non-square among the sizes; SigLIP 2: a static non-square size, where its
processor pads the patch sequence and masks it). Bound: the export gate's, max |d| <= 1e-4 and <= 1% of the
reference's spread. Tiny seeded configs (2 blocks, d=64, 2 heads, 64 px, patch 16) keep the file cheap.
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from hf_cache import offline_hub, write_folder
from photos import real_photos

from vitdeploy.errors import UserError
from vitdeploy.posembed import PosEmbedInterpolation
from vitdeploy.runtime.ort import OrtRunner

pytestmark = pytest.mark.slow  # exports

ORG = "tower-test"
LABELS = {i: f"kind-{i}" for i in range(4)}
NATIVE = (64, 64)
STATIC = (48, 80)  # 3 x 5 patches: non-square, fewer patches than the table (and than SigLIP 2's cap)
SIGLIP2_RULE = PosEmbedInterpolation("bilinear", False, True)  # transformers' Siglip2 resize


def _repos():
    import transformers as T

    vision = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, image_size=64, patch_size=16)
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=100,
                max_position_embeddings=16)
    heads = dict(num_labels=4, id2label=LABELS, label2id={v: k for k, v in LABELS.items()})
    clip_proc = T.CLIPImageProcessor(size={"shortest_edge": 72}, crop_size={"height": 64, "width": 64})  # CLIP mean/std
    siglip_proc = T.SiglipImageProcessor(size={"height": 64, "width": 64})  # resize to square, mean/std 0.5
    siglip2_proc = T.Siglip2ImageProcessor(max_num_patches=16, patch_size=16)  # NaFlex: aspect kept, <= 16 patches
    v2 = dict(vision, num_patches=16)
    return {  # key: (the model as published, its processor)
        "clip": (T.CLIPModel(T.CLIPConfig(vision_config=vision, text_config=text, projection_dim=48)), clip_proc),
        "clip-cls": (T.CLIPForImageClassification(T.CLIPConfig(vision_config=vision, text_config=text, **heads)), clip_proc),
        "siglip": (T.SiglipModel(T.SiglipConfig(vision_config=vision, text_config=text)), siglip_proc),
        "siglip-cls": (T.SiglipForImageClassification(T.SiglipConfig(vision_config=vision, text_config=text, **heads)), siglip_proc),
        "siglip2": (T.Siglip2Model(T.Siglip2Config(vision_config=v2, text_config=text)), siglip2_proc),
        "siglip2-cls": (T.Siglip2ForImageClassification(T.Siglip2Config(vision_config=v2, text_config=text, **heads)), siglip2_proc),
    }


def _give_weights(model: torch.nn.Module) -> None:
    """Real values where an init would hide a mistake: the position table (read in the wrong order it would
    still look random), the attention-pool probe, the classifier, the projection."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "position_embedding" in name or name.endswith("probe") or "classifier.weight" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif "visual_projection" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)


def _write(root: Path) -> None:
    import transformers as T

    T.utils.logging.disable_progress_bar()
    torch.manual_seed(0)
    commits = {}
    for key, (model, processor) in _repos().items():
        _give_weights(model)
        folder = root / "models" / key
        model.save_pretrained(folder)
        processor.save_pretrained(folder)
        commits[key] = write_folder(root / "hf-home", f"{ORG}/{key}", folder)
    (root / "commits.json").write_text(json.dumps(commits))


@pytest.fixture(scope="module")
def hub(shared_artifact, export_cached):
    root = shared_artifact(["hf-towers", 1], _write)
    home = root / "hf-home"

    def bundle(key: str, **options):
        # the dual encoders' native bundles as users get them (simplified: the precision units read them); the
        # other exports skip the simplifier's seconds
        simplify = key in ("clip", "siglip") and not options
        with pytest.MonkeyPatch.context() as mp:
            offline_hub(mp, home)
            return export_cached(f"hf:{ORG}/{key}", **{"check_images": 2, "simplify": simplify, **options})

    return types.SimpleNamespace(root=root, home=home, bundle=bundle, commits=json.loads((root / "commits.json").read_text()))


# -- transformers' own forward on the processor's tensors -------------------------------------------------
def _reference(hub, key: str, photos: np.ndarray) -> dict[str, np.ndarray]:
    """The repository's class from the cache folder (the dual encoder itself, not a tower class) on
    ``AutoImageProcessor(do_resize=False, do_center_crop=False)``: what a transformers user computes."""
    import transformers as T

    folder = hub.root / "models" / key
    config = T.AutoConfig.from_pretrained(folder)
    model = getattr(T, config.architectures[0]).from_pretrained(folder).eval()
    processor = T.AutoImageProcessor.from_pretrained(folder)
    inputs = processor(images=list(photos), do_resize=False, do_center_crop=False, return_tensors="pt")
    native = tuple(photos.shape[1:3]) == NATIVE
    kwargs = dict(inputs) if "spatial_shapes" in inputs else {"pixel_values": inputs["pixel_values"], "interpolate_pos_encoding": not native}
    with torch.no_grad():
        if key.endswith("-cls"):  # (CLIPForImageClassification passes interpolate_pos_encoding on to its tower)
            return {"logits": model(**kwargs).logits.numpy()}
        out = model.get_image_features(**kwargs)
        tower = model.vision_model(**kwargs)
    embedding = out if isinstance(out, torch.Tensor) else out.pooler_output  # transformers 4.x: a tensor
    tokens = tower.last_hidden_state
    if key == "clip":
        tokens = tokens[:, 1:]  # the CLS row
    if "spatial_shapes" in kwargs:  # SigLIP 2: the valid patches of each image (its processor pads the sequence)
        valid = int(kwargs["pixel_attention_mask"][0].sum())
        assert bool(kwargs["pixel_attention_mask"][:, :valid].all())
        tokens = tokens[:, :valid]
    return {"embedding": embedding.numpy(), "tokens": tokens.numpy()}


def _assert_close(got: np.ndarray, want: np.ndarray) -> None:
    from vitdeploy.compare import reference_spread

    assert got.shape == want.shape
    diff = float(np.abs(got - want).max())
    assert diff <= 1e-4 and diff <= 0.01 * reference_spread(want), (diff, reference_spread(want))


def _compare(hub, key: str, bundle, height: int, width: int) -> None:
    photos = real_photos(4, height, width)
    with OrtRunner(bundle.artifact_path("fp32")) as runner:
        got = runner.infer(photos)
    want = _reference(hub, key, photos)
    if "logits" in want:
        _assert_close(got["logits"], want["logits"])
        return
    _assert_close(got["embedding"], want["embedding"])
    grid = got["patch_grid"]  # [B, d, G_h, G_w], row-major patches
    _assert_close(grid.reshape(grid.shape[0], grid.shape[1], -1).transpose(0, 2, 1), want["tokens"])


PARITY = [  # key, export options, the sizes compared
    ("clip", {}, [NATIVE]),
    ("clip", {"dynamic_resolution": True}, [(96, 64), (64, 128)]),
    ("clip-cls", {}, [NATIVE]),
    ("siglip", {}, [NATIVE]),
    ("siglip", {"dynamic_resolution": True}, [(96, 64), (64, 128)]),
    ("siglip-cls", {"resolution": STATIC}, [STATIC]),
    ("siglip2", {}, [NATIVE]),
    ("siglip2", {"resolution": STATIC, "interpolation": SIGLIP2_RULE}, [STATIC]),
    ("siglip2-cls", {}, [NATIVE]),
]


@pytest.mark.parametrize("key,options,sizes", PARITY, ids=[f"{k}-{'-'.join(o) or 'native'}" for k, o, _ in PARITY])
def test_graph_equals_transformers_on_photos(hub, key, options, sizes):
    bundle = hub.bundle(key, **options)
    assert bundle.manifest["records"]["export_check"]["passed"]
    for height, width in sizes:
        _compare(hub, key, bundle, height, width)


# -- what a dual encoder exports --------------------------------------------------------------------------
def test_dual_encoders_export_their_image_tower_with_the_repository_processor(hub):
    from vitdeploy.costs import param_count

    clip, siglip, siglip2 = hub.bundle("clip"), hub.bundle("siglip"), hub.bundle("siglip2")
    for key, bundle in (("clip", clip), ("siglip", siglip), ("siglip2", siglip2)):
        manifest = bundle.manifest
        assert manifest["graph"]["outputs"] == ["embedding", "patch_grid"] and manifest["labels"] == []
        weights = manifest["source"]["weights"]
        assert (weights["repo_id"], weights["revision"], weights["file"]) == (f"{ORG}/{key}", hub.commits[key], "model.safetensors")
        assert manifest["source"]["architecture"] == {"clip": "CLIPModel", "siglip": "SiglipModel", "siglip2": "Siglip2Model"}[key]
    details = clip.manifest["graph"]["output_details"]["embedding"]
    assert details["shape"] == ["batch", 48] and "image_embeds" in details["reference"]  # projection_dim, not the width
    assert details["final_norm_where"] == "after pooling (post_layernorm)"
    pre = clip.preprocessing  # CLIPImageProcessor: shortest edge 72, centre crop 64, CLIP's mean/std, bicubic
    assert pre["host_resize"] == {"mode": "shorter-side-center-crop", "interpolation": "bicubic", "crop_pct": pytest.approx(64 / 72)}
    assert pre["mean"] == pytest.approx([0.48145466, 0.4578275, 0.40821073])
    assert siglip.manifest["graph"]["output_details"]["embedding"]["readout"] == "map"
    for bundle in (siglip, siglip2):  # SiglipImageProcessor: a square resize; SigLIP 2: the size a square image gets
        assert bundle.preprocessing["host_resize"]["mode"] == "stretch" and bundle.preprocessing["mean"] == [0.5] * 3
        assert tuple(bundle.preprocessing["input_size"]) == NATIVE
    # the cost model's terms: the MAP head and CLIP's projection and pre-norm, against the towers' parameters
    import transformers as T

    towers = {"clip": T.CLIPVisionModelWithProjection, "siglip": T.SiglipVisionModel}
    for key, bundle in (("clip", clip), ("siglip", siglip)):
        # (the vision sub-config of a CLIPModel repository does not carry projection_dim: the top level does)
        tower = towers[key].from_pretrained(hub.root / "models" / key, **({"projection_dim": 48} if key == "clip" else {}))
        params = sum(p.numel() for p in tower.parameters())
        d = bundle.spec.embed_dim
        # costs.py counts a patch-Conv bias; CLIP's Conv has none
        assert param_count(bundle.spec) == params + (d if key == "clip" else 0)
    terms = {t["name"]: t for t in siglip.spec.extra_terms}
    head = T.SiglipVisionModel.from_pretrained(hub.root / "models" / "siglip").head
    assert terms["map-head"]["params"] == sum(p.numel() for p in head.parameters())
    assert {t["name"] for t in clip.spec.extra_terms} == {"pre-layernorm", "projection"}


def test_map_head_cost_equals_a_count_of_its_multiplies(hub):
    """The MAP head's c0 + c1 L against torch's own count of its matmuls at two sequence lengths."""
    import transformers as T
    from torch.utils.flop_counter import FlopCounterMode

    from vitdeploy.exporters.adapters.hf_siglip import map_head_term

    model = T.SiglipVisionModel.from_pretrained(hub.root / "models" / "siglip", attn_implementation="eager").eval()
    spec = hub.bundle("siglip").spec
    term = map_head_term(model, spec)
    head = model.head
    head.attention.train()  # the math path (the fast path is one fused kernel FlopCounterMode does not see)
    for length in (16, 40):
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            head(torch.randn(1, length, spec.embed_dim))
        assert counter.get_total_flops() // 2 == term["macs"][0] + term["macs"][1] * length


# -- check, lint, precisions, refusals --------------------------------------------------------------------
@pytest.mark.parametrize("key", ["clip", "siglip", "siglip2"])
def test_check_passes_on_each_tower(hub, key):
    from vitdeploy.checks import CheckOptions, run_check

    with pytest.MonkeyPatch.context() as mp:
        offline_hub(mp, hub.home)
        report = run_check(hub.bundle(key).root, CheckOptions(random_count=4, write_report=False))
    assert report["passed"], report["failures"]


@pytest.mark.parametrize("key,options", [("clip", {"dynamic_resolution": True}), ("siglip", {"dynamic_resolution": True}),
                                         ("siglip2", {})])
def test_tensorrt_parsers_take_the_graphs(hub, key, options):
    """TensorRT 10.x and 11.x parse the graph as it is; 8.5/8.6 after the lowering (opset 17, Gelu, LayerNormalization)."""
    import onnx

    from vitdeploy.engine.lint import lint_file
    from vitdeploy.engine.lowering import lower_for
    from vitdeploy.engine.parser_rules import rules_for

    graph = hub.bundle(key, **options).artifact_path("fp32")
    for version in ("10.3", "11.4"):
        report = lint_file(graph, rules_for(version))
        assert report.clean, (version, report.lines())
    for version in ("8.5", "8.6"):
        rules = rules_for(version)
        assert not lint_file(graph, rules).blocking
        lower_for(onnx.load(str(graph)), rules)  # raises unless the lowered graph lints clean


@pytest.mark.parametrize("key,names", [("siglip", ["hf.head/qkv", "hf.head/attention-matmuls", "hf.head/mlp-fc1"]),
                                       # CLIP's QuickGELU MLP (x * sigmoid(1.702 x)) has its fc1/fc2 roles too
                                       ("clip", ["hf.visual_projection", "hf.vision_model.encoder.layers.1/mlp-fc2"])])
def test_precision_passes_on_the_towers_and_the_units_name_the_head(hub, key, names, copy_bundle, tmp_path):
    """debug-precision's units name the MAP head's layers / the projection; the fp16 gate passes; INT8 passes
    calibrate's gate, which for an embedding model is the embedding's cosine on held-out photos."""
    import onnx

    from vitdeploy.bundle import Bundle
    from vitdeploy.calibration.api import CalibrateOptions, calibrate_bundle
    from vitdeploy.calibration.precision_units import int8_units
    from vitdeploy.exporters.fp16 import add_fp16_to_bundle

    root = copy_bundle(hub.bundle(key))  # simplified, as users get it: the simplifier folds MHA's in_proj slices
    units = int8_units(onnx.load(str(root / "model.onnx")), Bundle.open(root).manifest["graph"])
    cells = [u.name for u in units["cells"]]
    assert set(names) <= set(cells), cells  # debug-precision ranks and names the head's own layers
    data = tmp_path / "photos.npy"
    np.save(data, real_photos(16, *NATIVE))
    add_fp16_to_bundle(Bundle.open(root), data=str(data))
    fp16 = Bundle.open(root).artifact_record("fp16")  # (a failed gate raises and writes nothing)
    assert fp16["gate"]["passed"] and fp16["sanity"]["output"] == "embedding"
    held_out = tmp_path / "held-out.npy"
    np.save(held_out, real_photos(24, *NATIVE)[16:])
    record = calibrate_bundle(root, CalibrateOptions(data=str(data), eval_data=str(held_out), samples=16, method="minmax", threads=1))
    assert record["placement"]["quantized_layers"] > 0
    gate = record["evaluation"]["gate"]
    assert gate["passed"], gate
    assert record["evaluation"]["reference"]["scored"] == "embedding" and record["evaluation"]["reference"]["top1_agreement"] is None
    photos = real_photos(24, *NATIVE)[16:]
    with OrtRunner(root / "model.onnx") as fp32, OrtRunner(root / "model.int8.onnx") as int8:
        ref, got = fp32.infer(photos)["embedding"], int8.infer(photos)["embedding"]
    cosine = (ref * got).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(got, axis=1)
    assert cosine.min() >= 0.99, cosine


@pytest.mark.parametrize("key,options,size", [("clip-cls", {}, NATIVE), ("siglip-cls", {"resolution": STATIC}, STATIC)])
def test_calibrate_gate_on_the_classifiers(hub, key, options, size, copy_bundle, tmp_path):
    from vitdeploy.calibration.api import CalibrateOptions, calibrate_bundle

    root = copy_bundle(hub.bundle(key, **options))
    data, held_out = tmp_path / "photos.npy", tmp_path / "held-out.npy"
    photos = real_photos(40, *size)
    np.save(data, photos[:16])
    np.save(held_out, photos[16:])
    # one recipe, gated relative to the fp32 graph on held-out photos (no labels: agreement and cosine)
    record = calibrate_bundle(root, CalibrateOptions(data=str(data), eval_data=str(held_out), samples=16, method="minmax", threads=1))
    assert record["evaluation"]["gate"]["passed"], record["evaluation"]["gate"]


def test_refusals_are_one_line(hub):
    from vitdeploy.exporters.adapters import hf_adapter
    from vitdeploy.exporters.sources import load_source

    adapter, arch = hf_adapter(types.SimpleNamespace(model_type="clip", architectures=["CLIPModel"]), "hf:x")
    assert adapter.name == "hf-clip" and adapter.load_plan(types.SimpleNamespace(
        vision_config=types.SimpleNamespace(), projection_dim=48), arch)[0] == "CLIPVisionModelWithProjection"
    so400m = types.SimpleNamespace(model_type="siglip", vision_config=types.SimpleNamespace(image_size=384, patch_size=14))
    with pytest.raises(UserError) as err:  # google/siglip-so400m-patch14-384: 27 patches and 6 pixels a side
        hf_adapter(so400m, "hf:x")[0].spec_from_config(so400m, None, "SiglipModel", True)
    assert "not whole 14x14 patches" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(UserError) as err:
        hf_adapter(types.SimpleNamespace(model_type="clip", architectures=["CLIPTextModel"]), "hf:x")
    assert "CLIPTextModel" in str(err.value) and "CLIPModel" in str(err.value) and "\n" not in str(err.value)
    with pytest.MonkeyPatch.context() as mp:
        offline_hub(mp, hub.home)
        with pytest.raises(UserError) as err:
            hub.bundle("siglip2", dynamic_resolution=True)
        assert "antialiased bilinear" in str(err.value) and "\n" not in str(err.value)
        loaded = load_source(f"hf:{ORG}/siglip2")
        with pytest.raises(UserError) as err:  # the bundle's default table convention is not SigLIP 2's rule
            loaded.adapter.regrid_static(loaded, *STATIC, PosEmbedInterpolation())
        assert "--pos-interp bilinear" in str(err.value) and "\n" not in str(err.value)
