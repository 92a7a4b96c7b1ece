"""`vitdeploy report` without a browser: the page is strict HTML5, self-contained, every number on it
equals the JSON record it names, stale evidence is marked, empty sections name their command, the
model card lists only what was measured, and bad input is one line with nothing written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.report_fixtures import check_numbers, copy_of, evidence_bundle, run_cli  # noqa: F401 (fixture)


def parse_strict(html: str):
    import html5lib

    parser = html5lib.HTMLParser(strict=True, namespaceHTMLElements=False)
    return parser.parse(html)  # raises ParseError on the first violation


def sourced_numbers(tree) -> list[tuple[str, str, str, str]]:
    return [(e.get("data-src"), e.get("data-value"), e.get("data-fmt"), "".join(e.itertext())) for e in tree.iter() if e.get("data-src")]


def write(bundle: Path, *extra: str):
    return run_cli("report", str(bundle), *extra)


def test_page_numbers_equal_their_json_and_nothing_is_fetched(evidence_bundle: Path, tmp_path: Path) -> None:
    bundle = copy_of(evidence_bundle, tmp_path)
    result = write(bundle)
    assert result.exit_code == 0, result.output
    page = bundle / "reports" / "index.html"
    assert f"report: {page}" in result.output
    html = page.read_text(encoding="utf-8")
    tree = parse_strict(html)
    files = check_numbers(bundle, sourced_numbers(tree))
    assert {"reports/check.json", "reports/evaluate.json", "reports/profile.json", "reports/occlusion/occlusion.json",
            "manifest.json", "cost-model"} <= files
    # self-contained: no script, no stylesheet link, every image inline
    assert not list(tree.iter("script")) and not list(tree.iter("link"))
    images = [img.get("src") for img in tree.iter("img")]
    assert len(images) >= 4 and all(src.startswith("data:image/png;base64,") for src in images)  # evaluate x2, occlusion, profile
    assert "http://" not in html and "https://" not in html
    # every section is there, with its content rather than the command that would fill it
    ids = {e.get("id") for e in tree.iter("section")}
    assert {"identity", "contract", "cost", "evidence", "precision", "robustness", "latency", "engines"} <= ids
    assert "not causality" in html and "random-weights" not in html
    assert 'id="no-engines"' in html and "vitdeploy build-engine" in html  # no engine built: the command that builds one
    check = json.loads((bundle / "reports" / "check.json").read_text())
    assert f"{check['reference']['accuracy']['digits:test']:.2%}" in html


def test_model_card_lists_only_what_was_measured(evidence_bundle: Path, tmp_path: Path) -> None:
    bundle = copy_of(evidence_bundle, tmp_path)
    assert write(bundle).exit_code == 0
    card = (bundle / "reports" / "MODEL_CARD.md").read_text(encoding="utf-8")
    front, body = card.split("---\n", 2)[1:]
    import yaml  # transformers' dependency: the card's front matter must be YAML the hub reads

    meta = yaml.safe_load(front)
    assert meta["library_name"] == "onnx" and "vision-transformer" in meta["tags"] and "base_model" not in meta  # builtin: no hub repo
    results = meta["model-index"][0]["results"]
    check = json.loads((bundle / "reports" / "check.json").read_text())
    evaluate = json.loads((bundle / "reports" / "evaluate.json").read_text())
    measured = {(r["dataset"]["name"], m["value"]) for r in results for m in r["metrics"]}
    assert ("digits:test", round(check["artifacts"][0]["sets"][1]["accuracy"], 6)) in measured
    assert ("digits:test (jpeg@30)", round(evaluate["results"]["onnx fp32"]["jpeg@30"]["accuracy"], 6)) in measured
    assert len(results) == 2  # one check accuracy (fp32) and one shifted condition: nothing that was not measured
    assert "sensitivities" in body


def test_stale_evidence_is_marked_and_left_out_of_the_card(evidence_bundle: Path, tmp_path: Path) -> None:
    bundle = copy_of(evidence_bundle, tmp_path)
    path = bundle / "reports" / "check.json"
    check = json.loads(path.read_text())
    check["artifacts"][0]["sha256"] = "0" * 64  # evidence measured on another graph than the manifest's current one
    path.write_text(json.dumps(check))
    assert write(bundle).exit_code == 0
    tree = parse_strict((bundle / "reports" / "index.html").read_text(encoding="utf-8"))
    evidence = next(e for e in tree.iter("section") if e.get("id") == "evidence")
    assert any(e.get("class") == "stale" for e in evidence.iter()) and "stale" in "".join(evidence.find("h2").itertext())
    card = (bundle / "reports" / "MODEL_CARD.md").read_text(encoding="utf-8")
    assert "vitdeploy check" not in card.split("---\n", 2)[1]  # the stale accuracy is not a model-index result


def test_an_empty_bundle_names_the_commands_that_fill_each_section(digits_bundle, tmp_path: Path) -> None:
    bundle = copy_of(digits_bundle.root, tmp_path)
    result = write(bundle, "-o", str(tmp_path / "out" / "page.html"))
    assert result.exit_code == 0, result.output
    html = (tmp_path / "out" / "page.html").read_text(encoding="utf-8")
    parse_strict(html)
    for command in (f"vitdeploy check {bundle}", f"vitdeploy evaluate {bundle}", f"vitdeploy profile {bundle}",
                    f"vitdeploy build-engine {bundle}", f"vitdeploy calibrate {bundle}"):
        assert command in html, command
    assert (tmp_path / "out" / "MODEL_CARD.md").is_file() and not (bundle / "reports" / "index.html").exists()
    assert "model-index" not in (tmp_path / "out" / "MODEL_CARD.md").read_text()  # nothing measured, nothing claimed


def test_labels_and_file_names_are_escaped(digits_bundle, tmp_path: Path) -> None:
    bundle = copy_of(digits_bundle.root, tmp_path)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["labels"][0] = "<img src=x onerror=alert(1)>"
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    assert write(bundle).exit_code == 0
    html = (bundle / "reports" / "index.html").read_text(encoding="utf-8")
    assert "<img src=x" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    parse_strict(html)


def assert_one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_a_folder_that_is_not_a_bundle(tmp_path: Path) -> None:
    assert_one_line_error(write(tmp_path), "is not a vitdeploy bundle")
    assert list(tmp_path.iterdir()) == []
    assert_one_line_error(write(tmp_path / "missing"), "does not exist")


def test_a_tampered_graph_is_refused_and_nothing_written(digits_bundle, tmp_path: Path) -> None:
    bundle = copy_of(digits_bundle.root, tmp_path)
    with open(bundle / "model.onnx", "ab") as fh:
        fh.write(b"\0")
    before = sorted(p.relative_to(bundle) for p in bundle.rglob("*"))
    assert_one_line_error(write(bundle), "model.onnx is not the fp32 graph this bundle's manifest vouches for")
    assert sorted(p.relative_to(bundle) for p in bundle.rglob("*")) == before


def test_a_report_folder_that_cannot_be_written(digits_bundle, tmp_path: Path) -> None:
    bundle = copy_of(digits_bundle.root, tmp_path)
    if os.access("/proc", os.W_OK) and os.geteuid() == 0:
        # root ignores permission bits; /proc refuses new entries to everyone
        assert_one_line_error(write(bundle, "-o", "/proc/vitdeploy-report/index.html"), "/proc/vitdeploy-report")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if not os.access(locked, os.W_OK):
            assert_one_line_error(write(bundle, "-o", str(locked / "index.html")), "not writable")
    finally:
        locked.chmod(0o700)
    assert list(locked.iterdir()) == [] and not (bundle / "reports").exists()
    assert_one_line_error(write(bundle, "-o", str(tmp_path)), "is a folder")


@pytest.fixture(scope="module")
def features_bundle(export_cached):
    """Embedding and patch grid only (the export test_outputs_runtime makes too): no logits, no probs."""
    return export_cached("builtin:digits", outputs=("embedding", "patch_grid"), normalize_embedding=True, resize=True, check_images=8)


@pytest.mark.slow  # its export is shared with tests/test_outputs_runtime.py, a slow module
def test_an_embedding_only_bundle(features_bundle, tmp_path: Path) -> None:
    bundle = copy_of(features_bundle.root, tmp_path)
    assert write(bundle).exit_code == 0
    html = (bundle / "reports" / "index.html").read_text(encoding="utf-8")
    tree = parse_strict(html)
    contract = "".join(next(e for e in tree.iter("section") if e.get("id") == "contract").itertext())
    assert "output embedding" in contract and "output patch_grid" in contract and "output logits" not in contract
    check_numbers(bundle, sourced_numbers(tree))


def test_engines_with_their_fingerprints_and_a_stale_one(tmp_path: Path) -> None:
    from tests.synthetic_bundle import fake_engine, make_bundle

    bundle = make_bundle(tmp_path / "b", fp16=True)
    fake_engine(bundle, "orin-fp16", "fp16", trt="10.3.0", gpu="Orin", cc="8.7", batch=(1, 4, 8), hw=16)
    fake_engine(bundle, "h200-fp32", "fp32", trt="10.8.0", gpu="NVIDIA H200", cc="9.0")
    bundle.manifest["engines"]["h200-fp32"]["source_sha256"] = "1" * 64  # built from a graph this bundle no longer holds
    bundle.save()
    assert write(bundle.root).exit_code == 0
    tree = parse_strict((bundle.root / "reports" / "index.html").read_text(encoding="utf-8"))
    section = next(e for e in tree.iter("section") if e.get("id") == "engines")
    rows = {"".join(r.find("td").itertext()): ["".join(td.itertext()) for td in r.findall("td")] for r in section.iter("tr") if r.find("td") is not None}
    orin, h200 = rows["orin-fp16"], rows["h200-fp32"]
    assert orin[1:4] == ["fp16", "10.3.0", "Orin (compute capability 8.7)"] and orin[7] == "current"
    assert "batch [1, 4, 8]" in orin[4] and "height [16, 16, 16]" in orin[4]
    assert "this TensorRT version only" in orin[5] and "hardware compatibility none" in orin[5]
    assert h200[2:4] == ["10.8.0", "NVIDIA H200 (compute capability 9.0)"] and h200[7] == "stale"
    assert not any(e.get("id") == "no-engines" for e in tree.iter())
