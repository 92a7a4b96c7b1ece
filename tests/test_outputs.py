"""`vitdeploy export --outputs`: the embedding and the patch grid beside (or instead of) class scores.

Acceptance of issue 12: for the five families of the export matrix (timm ViT, DeiT distilled, GAP
without class token, registers + patch 14, Hugging Face ViT) an export with
``--outputs embedding,patch_grid`` works at the native size, at another static size and with
--dynamic-resolution, and ONNX Runtime equals PyTorch to <= 1e-4 per output. PyTorch here is the
source library's own call (timm ``forward_head(forward_features(x), pre_logits=True)`` and
``forward_features``; transformers ``last_hidden_state``), not vitdeploy's adapter. Models are
random-init and small (depth 2, 64x64 or 56x56 inputs) so the 15 exports stay quick.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vitdeploy.errors import UserError
from vitdeploy.preprocess import random_images
from vitdeploy.runtime.ort import OrtRunner

pytestmark = pytest.mark.slow

FEATURES = ("embedding", "patch_grid")
# name -> (timm model, create_model kwargs, native size, other static size, dynamic sizes checked here)
TIMM = {
    "vit": ("vit_tiny_patch16_224", {"depth": 2, "img_size": 64}, 64, 96),
    "deit_distilled": ("deit_tiny_distilled_patch16_224", {"depth": 2, "img_size": 64}, 64, 96),
    "gap": ("vit_tiny_patch16_224", {"depth": 2, "img_size": 64, "class_token": False, "global_pool": "avg"}, 64, 96),
    "reg_p14": ("vit_small_patch14_reg4_dinov2", {"depth": 2, "img_size": 56, "num_classes": 5}, 56, 84),
}
FAMILIES = [*TIMM, "hf_vit"]


@pytest.fixture(scope="module")
def hf_dir(shared_artifact):
    """Written once per run into the shared artifact cache: the exports are keyed on this path, so every
    worker shares them."""
    return shared_artifact(["outputs-hf-vit", 1], _write_hf_vit) / "vit"


def _write_hf_vit(root):
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    torch.manual_seed(0)
    out = root / "vit"
    config = ViTConfig(image_size=64, patch_size=16, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=96, num_labels=4, id2label={i: f"c{i}" for i in range(4)}, label2id={f"c{i}": i for i in range(4)})
    ViTForImageClassification(config).save_pretrained(out)
    ViTImageProcessor(size={"height": 64, "width": 64}, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5]).save_pretrained(out)


def _source(family, hf_dir):
    if family == "hf_vit":
        return f"hf:{hf_dir}", {}, 64, 96
    name, kwargs, native, other = TIMM[family]
    kwargs = dict(kwargs)
    return f"timm:{name}", {"model_kwargs": kwargs, "random_init": True}, native, other


def _library_features(family, bundle, hf_dir, images):
    """(embedding, patch tokens [B, N, d]) from the source library itself, same weights."""
    from torchvision.transforms import Normalize

    pre = bundle.preprocessing
    x = Normalize(pre["mean"], pre["std"])(torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0)
    with torch.no_grad():
        if family == "hf_vit":
            from transformers import ViTModel

            hidden = ViTModel.from_pretrained(str(hf_dir), add_pooling_layer=False)(
                pixel_values=x, interpolate_pos_encoding=bundle.resolution["mode"] == "dynamic" or x.shape[-1] != 64).last_hidden_state
            return hidden[:, 0].numpy(), hidden[:, 1:].numpy()
        from vitdeploy.exporters import loaded_for_bundle

        net = loaded_for_bundle(bundle, tuple(images.shape[1:3]) if bundle.resolution["mode"] != "dynamic" else None).model
        tokens = net.forward_features(x)
        return net.forward_head(tokens, pre_logits=True).numpy(), tokens[:, net.num_prefix_tokens:].numpy()


def _check_against_library(family, bundle, hf_dir, size):
    images = random_images(4, size[0], size[1], seed=11)
    got = OrtRunner(bundle.artifact_path("fp32")).infer(images)
    assert list(got) == list(FEATURES)
    emb, tokens = _library_features(family, bundle, hf_dir, images)
    gh, gw = size[0] // bundle.spec.patch_size[0], size[1] // bundle.spec.patch_size[1]
    assert got["embedding"].shape == emb.shape == (4, bundle.spec.embed_dim)
    assert got["patch_grid"].shape == (4, bundle.spec.embed_dim, gh, gw)
    assert np.abs(got["embedding"] - emb).max() <= 1e-4
    # row-major grid: token n = r*G_w + s is cell (r, s)
    assert np.abs(got["patch_grid"].transpose(0, 2, 3, 1).reshape(4, gh * gw, -1) - tokens).max() <= 1e-4


def _verified(bundle):
    record = bundle.manifest["records"]["export_check"]
    assert record["passed"], record["failures"]
    return record


@pytest.mark.parametrize("family", FAMILIES)
def test_features_native_static_dynamic(family, hf_dir, export_cached):
    source, options, native, other = _source(family, hf_dir)
    for mode, extra, sizes in (
        ("native", {}, [(native, native)]),
        ("static", {"resolution": (other, other)}, [(other, other)]),
        ("dynamic", {"dynamic_resolution": True}, [(native, native + 2 * (native // 4)), (native + native // 2, native)]),
    ):
        bundle = export_cached(source, outputs=FEATURES, check_images=8, **options, **extra)
        _verified(bundle)
        assert bundle.manifest["graph"]["outputs"] == list(FEATURES)
        for size in sizes:
            _check_against_library(family, bundle, hf_dir, size)
        if mode == "dynamic":  # G_h, G_w are symbolic and named in the graph
            import onnx

            out = {o.name: o for o in onnx.load(str(bundle.artifact_path("fp32"))).graph.output}
            dims = [d.dim_param or d.dim_value for d in out["patch_grid"].type.tensor_type.shape.dim]
            assert dims == ["batch", bundle.spec.embed_dim, "grid_h", "grid_w"]


# -- a backbone without a head ----------------------------------------------------------------------
DINO = ("timm:vit_small_patch14_reg4_dinov2", {"depth": 2, "img_size": 56})


def test_backbone_without_head_exports_features_by_default(export_cached):
    """DINOv2 ships without a classifier: the default outputs are embedding,patch_grid, and it says so."""
    messages = []
    from vitdeploy.exporters import ExportOptions, export

    bundle = export_cached(DINO[0], model_kwargs=DINO[1], check_images=8, random_init=True)
    assert bundle.spec.num_classes == 0
    assert bundle.manifest["graph"]["outputs"] == ["embedding", "patch_grid"]
    details = bundle.manifest["graph"]["output_details"]
    assert details["patch_grid"]["dropped_tokens"] == {"cls": 1, "distillation": 0, "registers": 4}
    assert details["patch_grid"]["shape"] == ["batch", 384, 4, 4]
    assert details["embedding"]["readout"] == "cls" and details["embedding"]["final_norm"] == "norm"
    _verified(bundle)
    # asking it for logits fails before any export work, with the reason
    with pytest.raises(UserError, match="has no classification head"):
        export(DINO[0], bundle.root.parent / "dino-logits", ExportOptions(model_kwargs=DINO[1], outputs=("logits",), random_init=True), log=messages.append)
    assert not (bundle.root.parent / "dino-logits").exists()


def test_backbone_cli_says_so(tmp_path):
    from click.testing import CliRunner

    from vitdeploy.cli import main as cli

    result = CliRunner().invoke(cli, ["export", DINO[0], "--model-arg", "depth=2", "--model-arg", "img_size=56",
                                      "-o", str(tmp_path / "b"), "--no-check", "--no-simplify", "--random-init"])
    assert result.exit_code == 0, result.output
    assert "no classification head: exporting outputs embedding,patch_grid" in result.output
    result = CliRunner().invoke(cli, ["inspect", str(tmp_path / "b")])
    assert result.exit_code == 0 and "output patch_grid" in result.output and "registers 4" in result.output


# -- one-line errors ------------------------------------------------------------------------------
@pytest.mark.parametrize("args, message, code", [
    (["timm:vit_small_patch14_reg4_dinov2", "--model-arg", "depth=1", "--model-arg", "img_size=28", "--outputs", "logits,embedding", "--random-init"],
     "has no classification head", 1),
    (["--outputs", "logits,features"], "unknown output features", 2),
    (["--outputs", "logits", "--normalize-embedding"], "--normalize-embedding applies to the embedding output", 2),
    (["--variable-size", "--canvas", "32", "--outputs", "embedding"], "not available with --variable-size", 2),
])
def test_bad_output_requests_are_one_line(tmp_path, args, message, code):
    from click.testing import CliRunner

    from vitdeploy.cli import main as cli

    result = CliRunner().invoke(cli, ["export", *args, "-o", str(tmp_path / "b"), "--no-check"])
    assert result.exit_code == code, result.output
    assert message in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "b").exists()
