"""Issue 26: `hf:ORG/NAME[@REVISION]` loads model, config and image processor with transformers'
`from_pretrained` from a real Hugging Face cache written here: ViT, DeiT (distilled head), BEiT
(relative-position bias, mean pooling) and DINOv2 (classifier and the headless backbone).

Each family: labels from id2label, mean/std and the resize rule from the cached processor, the
revision and sha256 in the manifest, and ONNX Runtime = transformers' own model (loaded again from
the cache, not vitdeploy's wrapper) to <= 1e-4 at the bundle's size, another static size and
dynamic sizes. Models are seeded and tiny (2 blocks, d=32) so the exports stay quick.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hf_cache import copy_cache, offline_hub, repo_folder, write_folder

from vitdeploy.errors import UserError
from vitdeploy.fileio import sha256_file
from vitdeploy.preprocess import random_images
from vitdeploy.runtime.ort import OrtRunner

pytestmark = pytest.mark.slow  # exports

ORG = "vitdeploy-test"
LABELS = {i: f"kind-{i}" for i in range(4)}
MEAN, STD = [0.4, 0.5, 0.6], [0.2, 0.25, 0.3]


def _families():
    import transformers as T

    common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_labels=4, id2label=LABELS,
                  label2id={v: k for k, v in LABELS.items()})
    bit = dict(size={"shortest_edge": 64}, crop_size={"height": 56, "width": 56}, image_mean=MEAN, image_std=STD, resample=3)
    return {
        # key: (model, processor, expected host resize, size the bundle takes, another static size, dynamic sizes);
        # None: not exported here (DeiT's static and the backbone's dynamic path are ViT's and DINOv2's)
        "vit": (T.ViTForImageClassification(T.ViTConfig(image_size=64, patch_size=16, intermediate_size=64, **common)),
                T.ViTImageProcessor(size={"height": 64, "width": 64}, image_mean=MEAN, image_std=STD, resample=3),
                {"mode": "stretch", "interpolation": "bicubic", "crop_pct": None}, (64, 64), (96, 128), [(128, 128), (64, 96)]),
        "deit": (T.DeiTForImageClassificationWithTeacher(T.DeiTConfig(image_size=64, patch_size=16, intermediate_size=64, **common)),
                 T.DeiTImageProcessor(size={"height": 73, "width": 73}, crop_size={"height": 64, "width": 64}, image_mean=MEAN, image_std=STD),
                 {"mode": "stretch", "interpolation": "bicubic", "crop_pct": 64 / 73}, (64, 64), None, [(128, 128), (64, 96)]),
        "beit": (T.BeitForImageClassification(T.BeitConfig(image_size=64, patch_size=16, intermediate_size=64, use_relative_position_bias=True,
                                                            use_mean_pooling=True, **common)),
                 T.BeitImageProcessor(size={"height": 64, "width": 64}, do_center_crop=False, image_mean=MEAN, image_std=STD),
                 {"mode": "stretch", "interpolation": "bicubic", "crop_pct": None}, (64, 64), (96, 128), [(128, 128), (64, 96)]),
        # DINOv2 keeps a 112x112 (8x8) table and its processor crops 56x56: the bundle takes 56
        "dinov2": (T.Dinov2ForImageClassification(T.Dinov2Config(image_size=112, patch_size=14, **common)), T.BitImageProcessor(**bit),
                   {"mode": "shorter-side-center-crop", "interpolation": "bicubic", "crop_pct": 56 / 64}, (56, 56), (84, 112), [(112, 112), (56, 84)]),
        "dinov2-backbone": (T.Dinov2Model(T.Dinov2Config(image_size=112, patch_size=14, hidden_size=32, num_hidden_layers=2, num_attention_heads=2)),
                            T.BitImageProcessor(**bit),
                            {"mode": "shorter-side-center-crop", "interpolation": "bicubic", "crop_pct": 56 / 64}, (56, 56), (84, 112), None),
    }


def _give_weights(model: torch.nn.Module) -> None:
    """Non-trivial values where transformers initialises to zero (BEiT's bias tables) and a head with large logits."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "relative_position_bias_table" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            elif "classifier" in name and name.endswith("weight"):
                p.copy_(torch.randn(p.shape, generator=gen))
            elif "position_embeddings" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)


def _write_families(root: Path) -> None:
    """The five repositories in a Hugging Face home under ``root`` (seeded: the same bytes every time)."""
    home = root / "hf-home"
    torch.manual_seed(0)
    meta = {}
    for key, (model, processor, resize, size, static, dynamic) in _families().items():
        _give_weights(model)
        folder = root / "models" / key
        model.save_pretrained(folder)
        processor.save_pretrained(folder)
        repo = f"{ORG}/{key}"
        meta[key] = {"repo": repo, "commit": write_folder(home, repo, folder), "resize": resize, "size": size, "static": static,
                     "dynamic": dynamic}
    (root / "entries.json").write_text(json.dumps(meta))


class _Entry(dict):
    """One family's facts; its bundles (``native``, ``static_bundle``, ``dynamic_bundle``) are exported when a
    test first asks, so pytest-xdist workers export different families side by side instead of one worker
    exporting all of them while the other waits on the cache's lock."""

    def __init__(self, facts: dict, home: Path, export_cached) -> None:
        super().__init__(facts)
        self._home, self._export = home, export_cached

    def __missing__(self, name: str):
        options = {"native": {}, "static_bundle": {"resolution": self["static"]}, "dynamic_bundle": {"dynamic_resolution": True}}
        if name not in options or (name != "native" and not self[name.split("_")[0]]):
            raise KeyError(name)
        with pytest.MonkeyPatch.context() as mp:
            offline_hub(mp, self._home)
            self[name] = self._export(f"hf:{self['repo']}", check_images=2, simplify=False, **options[name])
        return self[name]


@pytest.fixture(scope="module")
def hub(shared_artifact, export_cached):
    """HF_HOME with the five repositories (built once per run for every worker, tests/artifact_cache.py);
    the bundles exported from them (offline) on first use, keyed on the home's stable path."""
    root = shared_artifact(["hf-families", 1], _write_families)
    home = root / "hf-home"
    entries = {}
    for key, entry in json.loads((root / "entries.json").read_text()).items():
        entry.update(folder=root / "models" / key, size=tuple(entry["size"]), static=tuple(entry["static"]) if entry["static"] else None,
                     dynamic=[tuple(d) for d in entry["dynamic"]] if entry["dynamic"] else None)
        entries[key] = _Entry(entry, home, export_cached)
    return {"home": home, "entries": entries}


def _reference(entry, images: np.ndarray, interpolate: bool) -> dict[str, np.ndarray]:
    """transformers' own model from the cache folder, on the processor's normalisation."""
    import transformers as T

    config = T.AutoConfig.from_pretrained(entry["folder"])
    cls = getattr(T, config.architectures[0])
    model = cls.from_pretrained(entry["folder"]).eval()
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0
    x = (x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    kwargs = {"interpolate_pos_encoding": True} if interpolate and config.model_type != "dinov2" else {}
    with torch.no_grad():
        out = model(pixel_values=x, **kwargs)
    if hasattr(out, "logits"):
        return {"logits": out.logits.numpy()}
    hidden = out.last_hidden_state.numpy()
    return {"embedding": hidden[:, 0], "tokens": hidden[:, 1:]}


def _compare(bundle, entry, height: int, width: int, interpolate: bool) -> None:
    images = random_images(3, height, width, seed=height + width)
    with OrtRunner(bundle.artifact_path("fp32")) as runner:
        got = runner.infer(images)
    want = _reference(entry, images, interpolate)
    if "logits" in want:
        assert np.abs(got["logits"] - want["logits"]).max() <= 1e-4
        assert np.abs(want["logits"]).max() > 0.1  # the head is not a near-zero init
    else:
        assert np.abs(got["embedding"] - want["embedding"]).max() <= 1e-4
        grid = got["patch_grid"]  # [B, d, G_h, G_w], row-major patches
        tokens = grid.reshape(grid.shape[0], grid.shape[1], -1).transpose(0, 2, 1)
        assert np.abs(tokens - want["tokens"]).max() <= 1e-4


FAMILY_KEYS = ["vit", "deit", "beit", "dinov2", "dinov2-backbone"]


@pytest.mark.parametrize("key", FAMILY_KEYS)
def test_labels_processor_and_identity_come_from_the_cache(hub, key):
    entry = hub["entries"][key]
    bundle = entry["native"]
    manifest = bundle.manifest
    assert manifest["labels"] == ([] if key == "dinov2-backbone" else [LABELS[i] for i in range(4)])
    pre = bundle.preprocessing
    assert pre["mean"] == pytest.approx(MEAN) and pre["std"] == pytest.approx(STD)
    assert pre["host_resize"]["mode"] == entry["resize"]["mode"]
    assert pre["host_resize"]["interpolation"] == entry["resize"]["interpolation"]
    assert pre["host_resize"]["crop_pct"] == pytest.approx(entry["resize"]["crop_pct"]) if entry["resize"]["crop_pct"] else \
        pre["host_resize"]["crop_pct"] is None
    assert tuple(pre["input_size"]) == entry["size"]
    file = repo_folder(hub["home"], entry["repo"]) / "snapshots" / entry["commit"] / "model.safetensors"
    weights = manifest["source"]["weights"]
    assert (weights["origin"], weights["repo_id"], weights["revision"], weights["file"]) == ("hf-hub", entry["repo"], entry["commit"], "model.safetensors")
    assert weights["sha256"] == sha256_file(file) == manifest["source"]["weights_sha256"]
    assert manifest["source"]["random_init"] is False


@pytest.mark.parametrize("key", FAMILY_KEYS)
def test_graph_equals_transformers_at_every_size(hub, key):
    entry = hub["entries"][key]
    _compare(entry["native"], entry, *entry["size"], interpolate=key.startswith("dinov2"))
    if entry["static"]:
        _compare(entry["static_bundle"], entry, *entry["static"], interpolate=True)
    for size in entry["dynamic"] or ():
        _compare(entry["dynamic_bundle"], entry, *size, interpolate=True)
    if entry["dynamic"]:
        assert entry["dynamic_bundle"].resolution["height"] == entry["size"][0]  # the nominal size is the processor's


def test_heads_and_read_outs_are_the_families_own(hub):
    entries = hub["entries"]
    assert entries["dinov2-backbone"]["native"].manifest["graph"]["outputs"] == ["embedding", "patch_grid"]
    spec = entries["beit"]["native"].spec
    assert spec.rel_pos_bias and spec.rel_pos_bias["scope"] == "per-block" and spec.global_pool == "avg"
    assert entries["deit"]["native"].spec.num_distill_tokens == 1
    assert entries["dinov2"]["native"].resolution["native"] == [112, 112]  # the table's size, resampled to 56


def test_dinov2_classifier_embedding_is_what_its_head_reads(hub, tmp_path, monkeypatch):
    from vitdeploy.exporters import ExportOptions, export

    offline_hub(monkeypatch, hub["home"])
    entry = hub["entries"]["dinov2"]
    bundle = export(f"hf:{entry['repo']}", tmp_path / "b", ExportOptions(outputs=("logits", "embedding"), check_images=2, simplify=False))
    assert bundle.manifest["graph"]["output_details"]["embedding"]["shape"] == ["batch", 64]  # [CLS, mean of patches]
    images = random_images(2, 56, 56, seed=3)
    with OrtRunner(bundle.artifact_path("fp32")) as runner:
        got = runner.infer(images)
    import transformers as T

    model = T.Dinov2ForImageClassification.from_pretrained(entry["folder"]).eval()
    x = (torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0 - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    with torch.no_grad():
        head_input = []
        model.classifier.register_forward_hook(lambda _m, args, _o: head_input.append(args[0]))
        logits = model(pixel_values=x).logits
    assert np.abs(got["embedding"] - head_input[0].numpy()).max() <= 1e-4
    assert np.abs(got["logits"] - logits.numpy()).max() <= 1e-4


def test_check_reloads_the_same_revision(hub, monkeypatch):
    from vitdeploy.exporters import loaded_for_bundle

    offline_hub(monkeypatch, hub["home"])
    bundle = hub["entries"]["beit"]["native"]
    loaded = loaded_for_bundle(bundle)
    assert loaded.source["weights_sha256"] == bundle.manifest["source"]["weights_sha256"]


# -- refusals, one line each -----------------------------------------------------------------------
def _write_config_only(home: Path, repo: str, config: dict) -> None:
    from hf_cache import write_snapshot

    write_snapshot(home, repo, {"config.json": json.dumps(config).encode()})


def test_a_class_vitdeploy_cannot_take_is_named(hub, monkeypatch, tmp_path):
    from transformers import SwinConfig

    from vitdeploy.exporters.sources import load_source

    config = SwinConfig(num_labels=3).to_dict()
    config["architectures"] = ["SwinForImageClassification"]
    home = copy_cache(hub["home"], tmp_path / "home")  # the shared home stays as built
    _write_config_only(home, f"{ORG}/swin", config)
    offline_hub(monkeypatch, home)
    with pytest.raises(UserError) as err:
        load_source(f"hf:{ORG}/swin")
    text = str(err.value)
    assert "is a SwinForImageClassification (model type 'swin')" in text and "Dinov2Model" in text and "\n" not in text


def test_weights_transformers_would_fill_randomly_are_refused(hub, monkeypatch, tmp_path):
    """A headless DINOv2 checkpoint declared as a classifier: transformers would add a random head (and log it)."""
    from vitdeploy.exporters.sources import load_source

    folder = hub["entries"]["dinov2-backbone"]["folder"]
    config = json.loads((folder / "config.json").read_text())
    config.update(architectures=["Dinov2ForImageClassification"], id2label={"0": "a", "1": "b"}, label2id={"a": 0, "b": 1})
    from hf_cache import write_snapshot

    home = copy_cache(hub["home"], tmp_path / "home")  # the shared home stays as built
    write_snapshot(home, f"{ORG}/dinov2-no-head", {"config.json": json.dumps(config).encode(),
                                                   "model.safetensors": folder / "model.safetensors",
                                                   "preprocessor_config.json": folder / "preprocessor_config.json"})
    offline_hub(monkeypatch, home)
    with pytest.raises(UserError) as err:
        load_source(f"hf:{ORG}/dinov2-no-head")
    assert "lacks 2 weights of Dinov2ForImageClassification (classifier.bias, classifier.weight)" in str(err.value)
    assert "random" in str(err.value) and "\n" not in str(err.value)


def test_uncached_hub_id_is_refused_and_nothing_written(hub, monkeypatch, tmp_path):
    from click.testing import CliRunner

    from vitdeploy.cli import main

    offline_hub(monkeypatch, hub["home"])
    result = CliRunner().invoke(main, ["export", "hf:google/vit-base-patch16-224", "-o", str(tmp_path / "b")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    (line,) = [ln for ln in result.output.splitlines() if ln.strip()]
    assert "hub repository google/vit-base-patch16-224" in line and "HF_HUB_OFFLINE=1" in line and "--random-init" in line
    assert not (tmp_path / "b").exists()


def test_random_init_from_the_cached_config_says_so(hub, monkeypatch, tmp_path):
    from click.testing import CliRunner

    from vitdeploy.cli import main

    offline_hub(monkeypatch, hub["home"])
    out = tmp_path / "b"
    result = CliRunner().invoke(main, ["export", f"hf:{ORG}/vit", "--random-init", "-o", str(out), "--check-images", "2", "--no-simplify"])
    assert result.exit_code == 0, result.output
    assert "warning: exporting RANDOM weights" in result.output
    source = json.loads((out / "manifest.json").read_text())["source"]
    assert source["random_init"] and source["weights"]["origin"] == "random"
    assert source["weights"]["config"] == {"repo_id": f"{ORG}/vit", "revision": hub["entries"]["vit"]["commit"]}
    # `check` rebuilds the same random weights from the recorded seed and config revision
    from vitdeploy.bundle import Bundle
    from vitdeploy.exporters import loaded_for_bundle

    assert loaded_for_bundle(Bundle.open(out)).source["weights_sha256"] == source["weights_sha256"]
