"""Protocol evidence: the artifact uses the model's own preprocessing, label order and patch grid.

A high accuracy can hide a preprocessing error the model happened to absorb (§39.7), and a wrong
mean/std, p instead of p/255, swapped channels or permuted labels all give plausible outputs
(§39.6). These checks compare the graph's own intermediate tensors with the source's config.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..bundle import Bundle, read_labels
from ..patches import patchify, unpatchify
from ..preprocess import normalise
from .taps import read_initializer, tapped_runner

IMAGENET = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
HALF = {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}


def _fit_channels(graph_x: np.ndarray, images: np.ndarray) -> list[dict[str, float]]:
    """Per output channel: which input channel it comes from and the affine map a*p + b."""
    fits = []
    pix = images.astype(np.float64).transpose(3, 0, 1, 2).reshape(3, -1)  # channel-major pixels
    for c in range(graph_x.shape[1]):
        target = graph_x[:, c].astype(np.float64).reshape(-1)
        best = None
        for k in range(3):
            design = np.stack([pix[k], np.ones_like(pix[k])], axis=1)
            coef, *_ = np.linalg.lstsq(design, target, rcond=None)
            resid = float(np.abs(design @ coef - target).max())
            if best is None or resid < best["residual"]:
                best = {"from_channel": k, "a": float(coef[0]), "b": float(coef[1]), "residual": resid}
        fits.append(best)
    return fits


def diagnose_preprocessing(graph_x: np.ndarray, images: np.ndarray, expected_pre: dict[str, Any]) -> dict[str, Any]:
    """Compare the graph's preprocessed tensor with the config's; name what differs."""
    expected = normalise(images, expected_pre)
    diff = float(np.abs(graph_x.astype(np.float64) - expected).max())
    result: dict[str, Any] = {"max_abs_vs_config": diff, "passed": diff <= 1e-4, "diagnosis": "matches the model's config"}
    if result["passed"]:
        return result
    fits = _fit_channels(graph_x, images)
    # The graph computes a*p + b per channel; with x = (p*s - m)/sd: sd = s/a, m = -b*sd.
    mean_cfg = np.asarray(expected_pre["mean"])
    std_cfg = np.asarray(expected_pre["std"])
    a = np.array([f["a"] for f in fits])
    b = np.array([f["b"] for f in fits])
    order = [f["from_channel"] for f in fits]
    want_order = [2, 1, 0] if expected_pre.get("channel_order") == "bgr" else [0, 1, 2]
    findings = []
    if order != want_order and len(set(order)) == 3:
        findings.append(f"channels swapped: the graph reads input channels {order} where the contract says {want_order} (RGB/BGR)")
    if np.allclose(a, 1.0 / std_cfg, rtol=1e-3):
        findings.append("input scaled 0-255: the graph normalises p instead of p/255")
        implied_std, implied_mean = 1.0 / a, -b / a
    else:
        implied_std = (1 / 255.0) / a
        implied_mean = -b * implied_std
        for name, ref in (("ImageNet", IMAGENET), ("0.5/0.5", HALF)):
            if np.allclose(implied_mean, ref["mean"], atol=2e-3) and np.allclose(implied_std, ref["std"], atol=2e-3) \
                    and not (np.allclose(mean_cfg, ref["mean"], atol=2e-3) and np.allclose(std_cfg, ref["std"], atol=2e-3)):
                findings.append(f"mean/std replaced by {name} values {ref['mean']}/{ref['std']}; "
                                f"the model's config says mean {_r(mean_cfg)} std {_r(std_cfg)}")
                break
        else:
            if not (np.allclose(implied_mean, mean_cfg, atol=2e-3) and np.allclose(implied_std, std_cfg, atol=2e-3)):
                findings.append(f"the graph normalises with mean {_r(implied_mean)} std {_r(implied_std)}; "
                                f"the model's config says mean {_r(mean_cfg)} std {_r(std_cfg)}")
    result.update({
        "diagnosis": "; ".join(findings) or f"baked preprocessing differs from the config (max |d| {diff:.3g})",
        "implied": {"channel_from": order, "mean": _r(implied_mean), "std": _r(implied_std)},
    })
    return result


def _r(values: Any) -> list[float]:
    return [round(float(v), 4) for v in np.asarray(values).ravel()]


def check_labels(bundle: Bundle, source_labels: list[str] | None, num_outputs: int) -> dict[str, Any]:
    """Label count matches the head, and the order matches the source (and labels.txt): index i names the
    class the source calls i. Repeated names are allowed (ImageNet's two "crane"s)."""
    problems: list[str] = []
    manifest_labels = bundle.labels
    file_labels = None
    labels_path = bundle.root / "labels.txt"
    if bundle.bare_onnx is None and labels_path.is_file():
        file_labels = read_labels(labels_path)
    for name, labels in (("manifest", manifest_labels), ("labels.txt", file_labels)):
        if labels is None:
            continue
        if len(labels) != num_outputs:
            problems.append(f"{name} has {len(labels)} labels but the head has {num_outputs} outputs")
    reference = source_labels if source_labels is not None else manifest_labels
    ref_name = "the source" if source_labels is not None else "the manifest"
    for name, labels in (("manifest", manifest_labels), ("labels.txt", file_labels)):
        if labels is None or labels is reference or len(labels) != len(reference):
            continue
        moved = [i for i, (x, y) in enumerate(zip(labels, reference)) if x != y]
        if moved:
            if sorted(labels) == sorted(reference) and len(moved) == 2:
                i, j = moved
                problems.append(f"{name} order differs from {ref_name}: {labels[j]!r} and {labels[i]!r} are swapped (lines {i + 1} and {j + 1})")
            else:
                problems.append(f"{name} order differs from {ref_name} at {len(moved)} positions (first: line {moved[0] + 1}, "
                                f"{labels[moved[0]]!r} vs {reference[moved[0]]!r})")
    return {"passed": not problems, "problems": problems, "num_outputs": num_outputs, "count": len(manifest_labels)}


def check_patch_grid(graph_x: np.ndarray, conv_out: np.ndarray, weight: np.ndarray | None, bias: np.ndarray | None,
                     patch: tuple[int, int]) -> dict[str, Any]:
    """patchify/unpatchify is exact on the graph's own preprocessed input, and the graph's patch
    tokens equal patchify + one shared linear map (§39.2), token n = r*G_w + s."""
    x = graph_x.astype(np.float64)
    tokens = patchify(x, patch)
    back = unpatchify(tokens, patch, x.shape[2:], x.shape[1])
    roundtrip = float(np.abs(back - x).max())
    result: dict[str, Any] = {"roundtrip_max_abs": roundtrip, "passed": roundtrip == 0.0}
    if weight is not None:
        d = weight.shape[0]
        linear = tokens @ weight.reshape(d, -1).T.astype(np.float64)
        graph_tokens = conv_out.astype(np.float64).reshape(conv_out.shape[0], d, -1).transpose(0, 2, 1)
        delta = graph_tokens - linear
        delta = delta - (bias.astype(np.float64) if bias is not None else delta.mean(axis=(0, 1)))
        scale = float(np.abs(graph_tokens).max()) or 1.0
        result["tokens_vs_linear_rel"] = float(np.abs(delta).max() / scale)
        result["passed"] = result["passed"] and result["tokens_vs_linear_rel"] <= 1e-4
    return result


def protocol_evidence(bundle: Bundle, contract: Any, feeds: dict[str, np.ndarray], source_pre: dict[str, Any] | None,
                      source_labels: list[str] | None) -> dict[str, Any]:
    """All protocol checks on the fp32 graph for one batch of named feeds (the input contract's)."""
    path = bundle.artifact_path("fp32")
    images = feeds[contract.image_input]
    tensors = bundle.graph.patch_embed or {}
    report: dict[str, Any] = {}
    expected_pre = dict(source_pre or bundle.preprocessing)
    expected_pre["channel_order"] = bundle.preprocessing.get("channel_order", "rgb")
    expected_pre["source"] = "re-loaded source config" if source_pre else "manifest (source not re-loadable)"
    if tensors and bundle.preprocessing.get("input") == "uint8-nhwc" and contract.in_graph_resize is None and len(feeds) == 1:
        runner, present = tapped_runner(path, [tensors["input"], tensors["output"]])
        out = runner.run(feeds)
        if tensors["input"] in present:
            pre = diagnose_preprocessing(out[tensors["input"]], images, expected_pre)
            pre["config_source"] = expected_pre["source"]
            report["preprocessing"] = pre
            weight = read_initializer(path, tensors["weight"]) if tensors.get("weight") else None
            bias = read_initializer(path, tensors["bias"]) if tensors.get("bias") else None
            report["patch_grid"] = check_patch_grid(out[tensors["input"]], out[tensors["output"]], weight, bias, tuple(bundle.spec.patch_size))
        num_outputs = out["logits"].shape[-1] if "logits" in out else bundle.spec.num_classes
    else:
        from ..runtime.ort import OrtRunner

        first = OrtRunner(path).run({name: value[:1] for name, value in feeds.items()})
        num_outputs = first["logits"].shape[-1] if "logits" in first else bundle.spec.num_classes
        why = "the graph records no patch-embedding tensors" if not tensors else "float input or in-graph resize"
        report["preprocessing"] = {"passed": None, "diagnosis": f"not applicable ({why})"}
    if bundle.embedding_model:
        # no class scores among the graph's outputs (bundle.embedding_model): nothing for a label to name
        report["labels"] = {"passed": None, "problems": [], "count": len(bundle.labels),
                            "skipped": f"{bundle.kind()}: no label count, order or accuracy to check"}
    else:
        report["labels"] = check_labels(bundle, source_labels, num_outputs)
    report["passed"] = all(v.get("passed") is not False for v in report.values() if isinstance(v, dict))
    return report
