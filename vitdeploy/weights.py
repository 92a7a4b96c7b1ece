"""The identity of a bundle's weights, in words: the one place the random-weights notice is written.

A bundle's manifest ``source`` carries a ``weights`` record (exporters/loaded.py): where the weights
came from (a hub repository at a commit, a checkpoint file, the builtin model) and the sha256 of
what was read, or ``random`` with its seed for exports made with ``--random-init``. Every command
that uses a bundle with random weights prints :func:`random_weights_notice` (inspect, predict, check,
evaluate, profile, embed, serve) and engine.json carries :func:`weights_record`, because such a
bundle runs and answers like a real one while its outputs mean nothing.

Core module: no torch, valid Python 3.8 (it runs on the device).
"""

from __future__ import annotations

from typing import Any

from .records import WeightsIdentity


def is_random(source: dict[str, Any] | None) -> bool:
    """True for weights made by --random-init (also in bundles written before the weights record)."""
    return WeightsIdentity.of_source(source).random


def random_weights_notice(source: dict[str, Any] | None, exporting: bool = False) -> str | None:
    """One line for a bundle whose weights are random (``exporting``: for the export that makes it); None for trained weights."""
    if not is_random(source):
        return None
    source = source or {}
    seed = WeightsIdentity.of_source(source).seed
    seed_text = f", seed {seed}" if seed is not None else ""
    what = f"{source.get('kind')}:{source.get('name')}"
    if exporting:
        return (f"exporting RANDOM weights ({what}, --random-init{seed_text}): the bundle will run like a real model but its "
                "outputs mean nothing, and every command that uses it says so")
    return (f"the weights of this bundle are RANDOM ({what} exported with --random-init{seed_text}): "
            "it runs like a real model but its outputs mean nothing; export without --random-init for the published weights")


def describe_weights(source: dict[str, Any] | None, with_sha256: bool = True) -> str:
    """Where the weights came from (and their sha256), in one line (inspect, the export log)."""
    source = source or {}
    weights = WeightsIdentity.of_source(source)
    origin = weights.origin
    digest = f", sha256 {weights.sha256}" if weights.sha256 and with_sha256 else ""
    if weights.random:
        return f"RANDOM (--random-init, seed {weights.seed}){', state-dict' + digest[1:] if digest else ''}"
    if origin == "hf-hub":
        asked = weights.requested_revision
        rev = f"@{weights.revision}" + (f" (asked: {asked})" if asked and asked != weights.revision else "")
        shards = weights.shards or []
        files = f"{weights.file}" + (f" + {len(shards)} shards" if shards else "")
        return f"Hugging Face hub {weights.repo_id}{rev}, {files}{digest}"
    if origin == "checkpoint" or (origin is None and source.get("checkpoint")):
        return f"checkpoint {weights.file or source.get('checkpoint')}{digest}"
    if origin == "builtin":
        return f"builtin {source.get('name')} ({weights.file}){digest}"
    if origin == "local-dir":
        return f"save_pretrained folder {source.get('name')} ({weights.file}){digest}"
    if origin == "url":
        return f"{weights.url} ({weights.file}){digest}"
    return f"{source.get('kind')}:{source.get('name')}{digest}"


def weights_record(source: dict[str, Any] | None) -> dict[str, Any]:
    """What engine.json says about the weights the engine computes."""
    weights = WeightsIdentity.of_source(source)
    record = {
        "origin": "random" if weights.random else weights.origin,
        "random": weights.random,
        "description": describe_weights(source),
        "sha256": weights.sha256,
    }
    notice = random_weights_notice(source)
    if notice:
        record["notice"] = notice
    return record
