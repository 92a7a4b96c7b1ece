"""The invariance sanity of a reduced-precision variable-size graph, before it is written (issue 13).

`convert --precision fp16` and `calibrate` run this on their candidate graph; `check` later scores
the same invariance against PyTorch. No torch here (the fp16 pass and calibrate run without it):

* reference: the bundle's fp32 two-input graph on each image ALONE (a batch of one with its own
  ``valid_hw``). The fp32 graph equals each image through a graph exported at its own size to
  <= 1e-4 (the export check and `check` establish that against PyTorch), so this is the at-own-size
  reference without a second graph per size;
* candidate: the fp16/int8 graph on ONE padded batch of seeded random images of mixed whole-patch
  sizes (the canvas, one patch, portrait and landscape extremes, the native size, random), with
  seeded noise in the padding;
* edge rows: one patch, the full canvas, and valid_hw values the graph clamps (0, negative, beyond
  the canvas, int32 extremes) must give finite outputs.

Per output (logits, probs): max |d|, the 1st-percentile row cosine, top-1 agreement. The gate
(:func:`gate_sanity`) is `check`'s reduced-precision gate (vitdeploy.gate.Gate) on these rows: the
cosine threshold per output, and finite outputs everywhere. INT8 is gated on labelled data by calibrate itself (random images
are not what it is calibrated for), so for int8 only finiteness is gated here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from vitdeploy.bundle import Bundle
from vitdeploy.errors import CheckFailed
from vitdeploy.gate import Gate

SIZES = 8
SEED = 0
OUTPUTS = ("logits", "probs")


def variable_sanity(fp32_path: str | Path, candidate_path: str | Path, bundle: Bundle, precision: str = "fp16",
                    optimization: str = "all") -> dict[str, Any]:
    """Candidate rows of a padded mixed-size batch vs the fp32 graph on each image alone; edge rows finite."""
    from vitdeploy.compare import compare_outputs
    from vitdeploy.runtime.ort import OrtRunner
    from vitdeploy.variable import edge_valid_hw, mixed_sizes, padded_batch, run_padded_graph

    contract = bundle.variable_size
    canvas, patch = tuple(contract["canvas"]), tuple(contract["round_to"])
    sizes = mixed_sizes(canvas, patch, tuple(bundle.spec.image_size), SIZES, seed=SEED)
    rng = np.random.default_rng(SEED)
    crops = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
    batch, valid = padded_batch(crops, canvas, seed=SEED + 1)
    cpu = ["CPUExecutionProvider"]
    reference = OrtRunner(fp32_path, providers=cpu)
    candidate = OrtRunner(candidate_path, precision=precision, providers=cpu, optimization=optimization)
    try:
        ref = run_padded_graph(reference.session, batch, valid, OUTPUTS, batch=1)
        got = run_padded_graph(candidate.session, batch, valid, OUTPUTS)
        edge = edge_valid_hw(canvas, patch)
        edge_images = np.random.default_rng(SEED + 2).integers(0, 256, (len(edge), canvas[0], canvas[1], 3), dtype=np.uint8)
        edge_out = run_padded_graph(candidate.session, edge_images, edge, OUTPUTS)
    finally:
        reference.close()
        candidate.close()
    outputs = {}
    for name in OUTPUTS:
        stats = compare_outputs(name, ref[name], got[name])
        outputs[name] = {k: getattr(stats, k) for k in ("max_abs", "cosine_p1", "cosine_min", "top1_agreement")}
    finite = bool(all(np.isfinite(got[n]).all() for n in OUTPUTS))
    edge_finite = bool(all(np.isfinite(edge_out[n]).all() for n in OUTPUTS))
    return {
        "kind": "variable-size invariance",
        "reference": "fp32 graph, each image alone (batch of one)",
        "candidate": f"{precision} graph, one padded batch of all sizes (noise padding)",
        "optimization": optimization,
        "sizes": [list(s) for s in sizes],
        "seed": SEED,
        "outputs": outputs,
        "finite": finite,
        "edge_valid_hw": edge.tolist(),
        "edge_finite": edge_finite,
        # the keys every fp16 sanity record has (`convert` prints them)
        "max_abs_logit_diff": outputs["logits"]["max_abs"],
        "top1_agreement": outputs["logits"]["top1_agreement"],
    }


def gate_sanity(sanity: dict[str, Any], precision: str, gate: Gate | None = None) -> None:
    """Raise CheckFailed (nothing is written) when the candidate breaks the invariance gate (default: `check`'s)."""
    gate = gate or Gate()
    problems = []
    if not sanity["finite"]:
        problems.append("non-finite outputs on the mixed-size batch")
    if not sanity["edge_finite"]:
        problems.append(f"non-finite outputs on edge valid_hw rows {sanity['edge_valid_hw']}")
    if precision != "int8":
        problems.extend(gate.rows_cosine_failures(sanity["outputs"]))
    sanity["gate"] = {"cosine_min": gate.min_cosine if precision != "int8" else None, "passed": not problems, "failures": problems}
    if problems:
        raise CheckFailed(f"the {precision} variable-size graph breaks the invariance (rows of a padded mixed-size batch vs each "
                          f"image alone through the fp32 graph): {'; '.join(problems)}; nothing was written")
