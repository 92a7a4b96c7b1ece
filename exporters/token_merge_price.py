"""The price of token merging, measured against the unmerged model (`check`; issue 40).

Kept apart from exporters/token_merge.py, which export_steps imports: this side runs the PyTorch
reference runner, which itself re-loads bundles through export_steps.
"""

from __future__ import annotations

from typing import Any


def merge_price(bundle: Any, sets: list[Any], merged_out: dict[str, dict[str, Any]], batch: int, threads: int | None,
                log: Any) -> dict[str, Any]:
    """What merging costs on the check's sets, measured against the unmerged PyTorch model: top-1
    agreement and accuracy of the merged reference vs the unmerged one (reported, not gated: the
    graph's gates are against the merged reference it implements)."""
    from .export_steps import loaded_for_bundle
    from .torch_runner import TorchRunner, bundle_contract

    _, kwargs = bundle_contract(bundle)
    runner = TorchRunner(loaded_for_bundle(bundle, merged=False), threads=threads, **kwargs)
    record: dict[str, Any] = {"schedule": bundle.manifest["token_merge"]["schedule"],
                              "reference": "the unmerged PyTorch model (same weights)", "sets": {}}
    for s in sets:
        if s.name not in merged_out or "logits" not in merged_out[s.name]:
            continue
        plain = runner.run_batched(s.feeds, batch)["logits"]
        merged = merged_out[s.name]["logits"]
        entry = {"agreement": float((plain.argmax(-1) == merged.argmax(-1)).mean())}
        if s.labels is not None:
            entry.update({"accuracy_unmerged": float((plain.argmax(-1) == s.labels).mean()),
                          "accuracy_merged": float((merged.argmax(-1) == s.labels).mean())})
        record["sets"][s.name] = entry
        acc = (f"; accuracy {entry['accuracy_unmerged']:.2%} unmerged -> {entry['accuracy_merged']:.2%} merged"
               if "accuracy_merged" in entry else "")
        log(f"token merging on {s.name}: top-1 agreement with the unmerged model {entry['agreement']:.2%}{acc} (reported, not gated)")
    runner.close()
    return record
