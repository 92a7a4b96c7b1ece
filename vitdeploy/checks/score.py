"""One artifact (a graph in one execution, or an engine) scored on every set against the reference.

Gates per set, by how the set is judged (vitdeploy.checks.sets):

- images (each image vs PyTorch on it): fp32: max |dlogit| <= --fp32-max-abs and within the share of
  the reference's spread across images; reduced precision: the 1st-percentile per-image cosine on
  real images (random ones where there are none), top-1 agreement and the accuracy drop on real
  labelled images; the feature outputs the graph declares (embedding, patch_grid) likewise.
- rows (each padded row of a mixed-size batch vs PyTorch on its image alone), per output (logits
  and probs): fp32: max |d| and 100% top-1 agreement, accuracy no lower than PyTorch alone; reduced
  precision: the 1st-percentile row cosine, and top-1 agreement and accuracy drop on the labelled set.
- finite (edge valid_hw rows): with the rows sets, no output value may be NaN or inf.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..compare import Criterion, accuracy, compare_outputs
from ..gate import Gate
from .sets import FINITE, IMAGES, ROWS, CheckSet

FEATURE_OUTPUTS = ("embedding", "patch_grid")
ROW_OUTPUTS = ("logits", "probs")


@dataclass
class Reference:
    """What every artifact of one check is scored against: the sets, PyTorch's outputs and accuracy on
    each, and the options (the gate's thresholds, batch)."""

    sets: list[CheckSet]
    outputs: dict[str, dict[str, np.ndarray]]  # set name -> PyTorch's named outputs
    accuracy: dict[str, float]  # set name -> PyTorch's accuracy on a labelled set
    opts: Any  # CheckOptions


def score(ref: Reference, precision: str, execution: str, runner: Any, gated: bool, sets: list[CheckSet] | None = None,
          batch: int | None = None, min_rows: int = 1) -> dict[str, Any]:
    """The artifact's entry on ``sets`` (default: all of them): per-set rows, every gate, the failed ones,
    and the verdict. ``batch``/``min_rows``: the rows per call the runner takes (an engine profile's)."""
    opts, ref_out, ref_acc = ref.opts, ref.outputs, ref.accuracy
    sets = ref.sets if sets is None else sets
    batch = batch or opts.batch
    rows, gates, structural = [], [], []
    nonfinite, finite_judged, edge = 0, False, None
    has_real = any(s.real for s in sets if s.judged == IMAGES)
    has_task = any(s.labels is not None for s in sets if s.judged == ROWS)
    for s in sets:
        out = runner.run_batched(s.feeds, batch, min_rows=min_rows)
        if s.judged == FINITE:
            bad = sum(int((~np.isfinite(v)).sum()) for v in out.values() if np.issubdtype(np.asarray(v).dtype, np.floating))
            edge, nonfinite, finite_judged = {"rows": int(len(s.images)), "nonfinite": bad}, nonfinite + bad, True
            continue
        if s.judged == ROWS:
            row, set_gates, bad = _rows_set(precision, s, out, ref_out[s.name], opts, has_task)
            nonfinite += bad
        else:
            row, set_gates, problems = _images_set(precision, s, out, ref_out[s.name], ref_acc, opts, has_real)
            structural.extend(problems)
        rows.append(row)
        gates.extend(set_gates)
    if finite_judged:
        gates.append(Criterion("non-finite output values (mixed batches and edge valid_hw rows)", nonfinite, 0, "<="))
    failed = structural + [g.describe() for g in gates if not g.passed]
    entry = {"precision": precision, "backend": runner.info.backend, "execution": execution, "gated": gated, "sets": rows,
             "gates": [g.to_dict() for g in gates], "failed_gates": failed, "passed": not failed}
    if edge is not None:
        entry["edge"] = edge
    return entry


def _images_set(precision: str, s: CheckSet, out: dict[str, np.ndarray], ref: dict[str, np.ndarray], ref_acc: dict[str, float],
                opts: Any, has_real: bool) -> tuple[dict[str, Any], list[Criterion], list[str]]:
    row: dict[str, Any] = {"set": s.name, "real": s.real}
    gate: Gate = opts.gate
    parity = gate.parity(precision)
    gates: list[Criterion] = []
    structural: list[str] = []
    # every output PyTorch gives must come out of the graph with the same shape (a head of another size,
    # a renamed output): named here instead of a shape error inside the comparison
    for name in [n for n in ref if n in out and np.shape(out[n]) != np.shape(ref[n])] + [n for n in ref if n not in out]:
        got = f"shape {list(np.shape(out[name]))}" if name in out else "no such output"
        structural.append(f"output {name} on {s.name}: {got} from the graph, shape {list(np.shape(ref[name]))} from PyTorch")
        ref = {k: v for k, v in ref.items() if k != name}
    # parity holds on every set; the task thresholds are read on real images (random ones when there are none)
    judged_here = parity or s.real or not has_real
    if "logits" in ref and "logits" in out:
        stats = compare_outputs("logits", ref["logits"], out["logits"])
        row["logits"] = stats.to_dict()
        if "probs" in ref and "probs" in out:
            row["probs"] = compare_outputs("probs", ref["probs"], out["probs"]).to_dict()
        if s.labels is not None:
            row["accuracy"] = accuracy(out["logits"], s.labels)
            row["accuracy_drop"] = ref_acc[s.name] - row["accuracy"]
        if judged_here:
            gates.extend(gate.numeric(precision, stats, "logit", "cosine (1st percentile of images)", f" on {s.name}"))
            if s.real and not parity:
                gates.append(gate.agreement(precision, stats.top1_agreement, f"top-1 agreement on {s.name}"))
        if s.labels is not None and not parity:
            gates.append(gate.accuracy_drop(precision, row["accuracy_drop"], f"accuracy drop on {s.name}"))
    # The feature outputs the graph declares: max |d| and the worst per-image cosine (fp32), the
    # 1st-percentile per-image cosine (reduced precision), as for the logits.
    for name in FEATURE_OUTPUTS:
        if name not in ref or name not in out:
            continue
        feat = compare_outputs(name, ref[name], out[name])
        row[name] = {k: v for k, v in feat.to_dict().items() if k not in ("top1_agreement", "top5_agreement")}
        if judged_here:
            gates.extend(gate.numeric(precision, feat, name, f"{name} cosine (1st percentile of images)", f" on {s.name}",
                                      worst_cosine_name=f"{name} cosine (worst image)"))
    return row, gates, structural


def _rows_set(precision: str, s: CheckSet, out: dict[str, np.ndarray], ref: dict[str, np.ndarray], opts: Any,
              has_task: bool) -> tuple[dict[str, Any], list[Criterion], int]:
    row: dict[str, Any] = {"set": s.name, "real": s.real, "what": s.what}
    gate: Gate = opts.gate
    parity = gate.parity(precision)
    gates: list[Criterion] = []
    nonfinite = sum(int((~np.isfinite(out[n])).sum()) for n in ROW_OUTPUTS if n in out)
    for name in ROW_OUTPUTS:
        stats = compare_outputs(name, ref[name], out[name])
        row[name] = {k: v for k, v in stats.to_dict().items() if k != "name"}
        if parity:
            gates.extend(gate.numeric(precision, stats, name, "", f" on {s.name} (rows vs alone)"))
        elif s.labels is not None or not has_task:
            gates.extend(gate.numeric(precision, stats, name, f"{name} cosine (1st percentile of rows)", f" on {s.name}"))
    top1 = row["logits"]["top1_agreement"]
    if parity or s.labels is not None:  # parity: every row agrees with its image alone
        gates.append(gate.agreement(precision, top1, f"top-1 agreement on {s.name} (rows vs alone)"))
    if s.labels is not None:
        row["accuracy"] = accuracy(out["logits"], s.labels)
        row["accuracy_drop"] = accuracy(ref["logits"], s.labels) - row["accuracy"]
        gates.append(gate.accuracy_drop(precision, row["accuracy_drop"], f"accuracy drop on {s.name}"))
    row["passed"] = all(g.passed for g in gates)
    return row, gates, nonfinite


def batch_consistency(runner: Any, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
    """The same rows one at a time and as one batch give the same outputs (the dynamic batch axis; for a
    canvas, a row does not depend on the rows beside it)."""
    first = runner.run(feeds)
    name = "logits" if "logits" in first else next(iter(first))  # a backbone graph: its embedding
    rows = len(next(iter(feeds.values())))
    single = np.concatenate([runner.run({k: v[i:i + 1] for k, v in feeds.items()})[name] for i in range(rows)])
    return {"images": int(rows), "output": name, "max_abs": float(np.abs(first[name].astype(np.float64) - single).max())}


def summary(entry: dict[str, Any]) -> str:
    """One phrase for the log line of a rows-judged entry (mixed-size batches); empty for the others."""
    rows = {row["set"]: row for row in entry.get("sets", []) if "what" in row}
    if "numbers" not in rows:
        return ""
    numbers = rows["numbers"]
    text = (f"random rows vs alone: max |dlogit| {numbers['logits']['max_abs']:.1e}, "
            f"cosine p1 logits {numbers['logits']['cosine_p1']:.5f} / probs {numbers['probs']['cosine_p1']:.5f}")
    task = rows.get("task")
    if task:
        text += (f"; task: accuracy {task['accuracy']:.2%}, agreement {task['logits']['top1_agreement']:.1%}, "
                 f"cosine p1 {task['logits']['cosine_p1']:.4f}, max |dlogit| {task['logits']['max_abs']:.1e}")
    if entry.get("edge", {}).get("nonfinite"):
        text += f"; {entry['edge']['nonfinite']} non-finite values on edge valid_hw rows"
    return text
