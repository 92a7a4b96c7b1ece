"""The Jetson matrix (JetPack <-> L4T <-> CUDA <-> TensorRT <-> modules <-> DLA) and named targets.

No Jetson ran any of this: the matrix is data read from the sources in ``jetpack.SOURCES`` and the
device strings below are quoted from public records of real devices:

* ``/etc/nv_tegra_release`` first lines: dusty-nv/jetson-containers jetson_containers/l4t_version.py
  (comments quoting R35.3.1 and R32.7.1 boards); and, as realistic parser input only, three public
  third-party device reports whose repositories could not be identified (so they are cited nowhere
  and the matrix marks what only they showed as unconfirmed): an Orin NX on R36.4.4 (nvidia-jetpack
  6.2.1), an AGX Orin on R39.2.0 (nvcc 13.2) and an Orin Nano Super on R39.2.1 (nvidia-jetpack 7.2.1,
  tensorrt 10.16.2.10, nvcc 13.2, Python 3.12.3).
* ``/proc/device-tree/model`` strings: the same device reports.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from engine_fixtures import write_bundle

from vitdeploy.cli import main
from vitdeploy.engine import fingerprint, jetpack, targets
from vitdeploy.engine.plan import PlanOptions
from vitdeploy.engine.service import BuildEngineRequest, run
from vitdeploy.errors import ConfigError, UserError

R35 = "# R35 (release), REVISION: 3.1, GCID: 32790763, BOARD: t186ref, EABI: aarch64, DATE: Wed Mar 15 07:54:12 UTC 2023"
R36_44 = "# R36 (release), REVISION: 4.4, GCID: 41062509, BOARD: generic, EABI: aarch64, DATE: Mon Jun 16 16:07:13 UTC 2025"
R39 = "# R39 (release), REVISION: 2.0, GCID: 45755727, BOARD: generic, EABI: aarch64, DATE: Mon Jun  1 09:28:48 PM UTC 2026"
R39_21 = "# R39 (release), REVISION: 2.1, GCID: 46758480, BOARD: generic, EABI: aarch64, DATE: Fri Aug  7 05:54:22 AM UTC 2026"
AGX_ORIN = "NVIDIA Jetson AGX Orin Developer Kit"
ORIN_NX = "NVIDIA Jetson Orin NX Engineering Reference Developer Kit"
ORIN_NANO_SUPER = "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super"


@pytest.fixture(scope="module")
def mini_bundle(tmp_path_factory):
    return write_bundle(tmp_path_factory.mktemp("targets") / "b", precisions=("fp32", "fp16"))


def test_matrix_is_consistent_data():
    fields = set(jetpack.Release.__dataclass_fields__)
    for release in jetpack.RELEASES:
        assert release.sources and all(key in jetpack.SOURCES for key in release.sources), release.jetpack
        assert set(release.unconfirmed) <= fields
        assert all(m in jetpack.MODULES for m in release.modules)
        assert all(len(l4t.split(".")) == 3 for l4t in release.l4t)
    for module in jetpack.MODULES.values():
        assert all(key in jetpack.SOURCES for key in module.sources) and set(module.unconfirmed) <= set(jetpack.Module.__dataclass_fields__)
    # the facts the issue names, each as the matrix holds it
    jp70, jp72, jp722 = (jetpack.RELEASE_BY_KEY[k] for k in ("7.0", "7.2", "7.2.2"))
    assert jp70.modules == ("agx-thor",) and jp70.cuda == "13.0" and jp70.dla is False
    assert {"agx-orin", "orin-nano", "agx-thor"} <= set(jp72.modules)  # Orin and Thor on one stack
    assert jp722.tensorrt == "11.4.1" and jp722.dla_modules == ("agx-orin",) and "tensorrt" not in jp722.unconfirmed
    assert jetpack.MODULES["agx-thor"].compute_capability == "11.0" and jetpack.MODULES["agx-thor"].dla_cores == 0
    assert all(not r.tensorrt.startswith("11.") for r in jetpack.RELEASES if r.jetpack.startswith("6."))  # 6.x never gets 11
    # a fact no stored source confirmed is marked, never silently asserted
    assert "tensorrt" in jp70.unconfirmed and "dla_cores" in jetpack.MODULES["orin-nano"].unconfirmed


@pytest.mark.parametrize("l4t, jp", [("35.2.1", "5.1"), ("35.4.1", "5.1.2"), ("36.4.0", "6.1"), ("36.4", "6.1"),
                                     ("36.4.3", "6.2"), ("38.2.1", "7.0"), ("38.4.0", "7.1"), ("39.2.0", "7.2"),
                                     ("39.2.1", "7.2.1"), ("35.1", "5.0.2"), ("36.5.0", "6.x"), ("35.6.1", "5.x"), ("99.1", None)])
def test_l4t_to_jetpack_is_exact(l4t, jp):
    # exact releases only: a prefix match would call 35.6.1 JetPack 5.1.4 and 36.5.0 JetPack 6.2
    assert fingerprint.jetpack_for_l4t(l4t) == jp


def test_tegra_release_lines_from_real_boards():
    assert fingerprint.parse_tegra_release(R35) == {"l4t": "35.3.1", "jetpack": "5.1.1"}
    assert fingerprint.parse_tegra_release(R36_44) == {"l4t": "36.4.4", "jetpack": "6.2.1"}
    assert fingerprint.parse_tegra_release(R39) == {"l4t": "39.2.0", "jetpack": "7.2"}
    assert fingerprint.parse_tegra_release(R39_21) == {"l4t": "39.2.1", "jetpack": "7.2.1"}
    # what that Orin Nano Super had installed is what the 7.2.1 row says, marked unconfirmed (no source to cite)
    jp721 = jetpack.RELEASE_BY_KEY["7.2.1"]
    assert (jp721.cuda, jp721.tensorrt, jp721.python) == ("13.2", "10.16.2", "3.12")
    assert set(jp721.unconfirmed) == {"l4t", "cuda", "tensorrt", "python"}
    assert "orin-nano" in jp721.modules
    assert [jetpack.module_from_model(m).key for m in (AGX_ORIN, ORIN_NX, ORIN_NANO_SUPER)] == ["agx-orin", "orin-nx-16gb", "orin-nano"]
    assert jetpack.module_from_model("NVIDIA H200") is None


def test_target_names_resolve_and_refuse():
    t = targets.resolve("jp6.2-orin-nano")
    assert (t.trt_version, t.module.key, t.dla_cores, t.name) == ("10.3.0", "orin-nano", 0, "jp6.2-orin-nano")
    assert targets.resolve("jetpack-7.1-thor").module.key == "agx-thor"
    assert targets.resolve("jp7.2").module is None
    with pytest.raises(ConfigError, match="does not support Jetson Orin Nano"):
        targets.resolve("jp7.1-orin-nano")  # JetPack 7.0/7.1 are Thor-only
    with pytest.raises(ConfigError, match="does not support Jetson Orin NX 16GB"):
        targets.resolve("jp7.2.2-orin-nx")  # TensorRT 11.4.1: AGX Orin and Thor only
    with pytest.raises(UserError, match="not in vitdeploy's matrix"):
        targets.resolve("jp4.6-agx-xavier")
    with pytest.raises(UserError, match="not jpX.Y"):
        targets.resolve("orin")
    assert not targets.is_target_name("nvidia-h200-trt10.3.0-fp16")  # an ordinary engine folder name


@pytest.mark.parametrize("name, message", [
    ("jp7.1-agx-thor", r"Jetson AGX Thor \(T5000\) has no DLA"),
    ("jp7.2.2-agx-thor", "has no DLA"),
    ("jp6.2-orin-nano", "Jetson Orin Nano has no DLA"),
])
def test_dla_refused_where_the_module_has_none(name, message):
    with pytest.raises(ConfigError, match=message):
        targets.check_dla(targets.resolve(name), 0)


def test_hardware_compatible_refused_for_jetson_targets(mini_bundle):
    # NVIDIA's developer guide: hardware compatibility is not supported on JetPack (jetpack.SOURCES, read as quoted)
    options = PlanOptions(precision="fp16", target="jp6.2-agx-orin", hardware_compatibility="ampere+")
    with pytest.raises(ConfigError, match="not support hardware-compatible engines on JetPack"):
        run(BuildEngineRequest(mini_bundle.root, options, dry_run=True))
    targets.check_portability(targets.resolve("jp7.1-agx-thor"), "none")  # the default is fine
    # version-compatible and weight-stripped engines stay allowed on a Jetson target
    outcome = run(BuildEngineRequest(mini_bundle.root, PlanOptions(precision="fp16", target="jp7.1-agx-thor", version_compatible=True,
                                                                    strip_weights=True), dry_run=True))
    assert outcome.exit_code == 0 and outcome.plan.version_compatible and outcome.plan.strip_weights
    res = CliRunner().invoke(main, ["targets", "--jetpack", "6.2", "--sources"])
    assert "[nv-trt86-hwcompat]" in res.output


def test_dla_notes_where_sources_leave_it_open():
    assert targets.check_dla(targets.resolve("jp6.2-agx-orin"), 1) == []
    with pytest.raises(ConfigError, match="0..1"):
        targets.check_dla(targets.resolve("jp6.2-agx-orin"), 2)
    notes = targets.check_dla(targets.resolve("jp7.2-agx-orin"), 0)
    assert any("10.7 was the last 10.x release" in n for n in notes)
    assert any("depends on the module" in n for n in targets.check_dla(targets.resolve("jp7.2"), 0))


# The acceptance rows: each plans its TensorRT, the lowering that version needs, and no DLA where none.
ROWS = [("jp5.1-agx-orin", "8.5.2", "model.fp16.trt8.5.onnx", "8.5"), ("jp6.0-orin-nano", "8.6.2", None, "8.6"),
        ("jp6.2-orin-nano", "10.3.0", None, "10.3"), ("jp7.1-agx-thor", "10.13.3", None, "10.13"),
        ("jp7.2-orin-nano", "10.16.1", None, "10.16"), ("jp7.2.1-orin-nano", "10.16.2", None, "10.16"),
        ("jp7.2.2-agx-orin", "11.4.1", None, "11.4")]


@pytest.mark.parametrize("name, trt, parsed, rules", ROWS)
def test_dry_run_per_jetpack_row(mini_bundle, name, trt, parsed, rules):
    outcome = run(BuildEngineRequest(mini_bundle.root, PlanOptions(precision="fp16", target=name), dry_run=True))
    plan = outcome.plan
    assert outcome.exit_code == 0 and plan.trt_version == trt and plan.device_target["name"] == name
    assert outcome.lint.rules.key == rules and outcome.lint.findings == []
    # 8.5 (JetPack 5.1) cannot read LayerNormalization: the lowered graph is what it parses; 8.6+ read this opset-17 graph
    assert (plan.parse_graph and plan.parse_graph.endswith(parsed)) if parsed else plan.parse_graph is None
    assert plan.precision_path == ("typed-graph+flags" if trt.startswith("8.") else "strongly-typed")
    report = json.loads((mini_bundle.root / "reports" / f"engine-plan-{name}.json").read_text())
    assert report["plan"]["device_target"]["tensorrt"] == trt and report["capabilities"]["version"] == trt


def test_thor_dla_is_refused_through_the_cli(mini_bundle):
    res = CliRunner().invoke(main, ["build-engine", str(mini_bundle.root), "--dry-run", "--precision", "fp16",
                                    "--target", "jp7.1-agx-thor", "--dla-core", "0"])
    assert res.exit_code == 1 and "has no DLA" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(main, ["build-engine", str(mini_bundle.root), "--dla-report", "--target", "jp7.0-agx-thor"])
    assert res.exit_code == 1 and "no usable DLA" in res.output
    res = CliRunner().invoke(main, ["build-engine", str(mini_bundle.root), "--dry-run", "--target", "jp6.2", "--trt-version", "10.16"])
    assert res.exit_code == 1 and "ships TensorRT 10.3.0" in res.output


def test_install_check_against_recorded_device_strings():
    ok = targets.check_stack(R36_44, ORIN_NX, "10.3.0.30", "3.10")
    assert ok.jetpack == "6.2.1" and ok.module.key == "orin-nx-16gb" and ok.problems == []
    assert any("not confirmed" in n for n in ok.notes)  # 6.2.1's stack is assumed equal to 6.2's
    wrong = targets.check_stack(R39, AGX_ORIN, "10.3.0", "3.12")
    assert wrong.jetpack == "7.2" and len(wrong.problems) == 1 and "TensorRT 10.3.0 is installed" in wrong.problems[0]
    missing = targets.check_stack(R35, "NVIDIA Jetson AGX Orin Developer Kit", None, "3.8")
    assert "system dist-packages" in missing.problems[0] and "--system-site-packages" in missing.problems[0]
    unknown = targets.check_stack("# R36 (release), REVISION: 5.0, GCID: 1, BOARD: generic", AGX_ORIN, "10.3.0")
    assert unknown.jetpack == "6.x" and "not in vitdeploy's matrix" in unknown.problems[0]
    here = targets.check_stack(None, None, None)
    assert here.ok and here.l4t is None and "not a Jetson" in here.lines()[0]


def test_targets_command():
    runner = CliRunner()
    res = runner.invoke(main, ["targets"])
    assert res.exit_code == 0
    lines = res.output.splitlines()
    assert lines[0].split()[:5] == ["target", "JetPack", "L4T", "CUDA", "TensorRT"]
    thor = next(line for line in lines if line.startswith("jp7.1-agx-thor "))
    assert thor.split()[1:] == ["7.1", "38.4.0", "13.0", "10.13.3?", "10.13", "-", "11.0", "0", "3.12?"]
    assert next(line for line in lines if line.startswith("jp5.1-agx-orin ")).split()[5:7] == ["8.5", "opset"]
    data = json.loads(runner.invoke(main, ["targets", "--jetpack", "7.2.2", "--json"]).output)
    assert [t["name"] for t in data["targets"]] == ["jp7.2.2-agx-orin", "jp7.2.2-agx-thor"]
    assert data["targets"][0]["module"]["dla_cores_usable"] == 2 and data["targets"][1]["module"]["dla_cores_usable"] == 0
    assert "nv-trt1141-dla" in data["targets"][0]["sources"]
    assert runner.invoke(main, ["targets", "--jetpack", "4.6"]).exit_code == 1
    src = runner.invoke(main, ["targets", "--module", "agx-thor", "--sources"]).output
    assert "[nv-trt1141-dla] https://docs.nvidia.com/deeplearning/tensorrt/11.4.1/" in src
    check = runner.invoke(main, ["targets", "--check"])  # this machine is not a Jetson
    assert check.exit_code == 0 and "not a Jetson" in check.output


def test_exported_bundle_gets_the_8x_lowering_from_its_target(digits_bundle, copy_bundle):
    # the digits bundle is what export writes (opset 20, Gelu, LayerNormalization): JetPack 6.0's 8.6 parser needs
    # it lowered to opset 17 without Gelu; JetPack 6.2's 10.3 and JetPack 7.2's 10.16 read it as it is
    root = copy_bundle(digits_bundle)
    low = run(BuildEngineRequest(root, PlanOptions(precision="fp32", target="jp6.0-orin-nano"), dry_run=True))
    assert low.plan.parse_graph.endswith("model.trt8.6.onnx") and low.plan.lowering["opset"] == [20, 17]
    assert any(k.startswith("Gelu") for k in low.plan.lowering["rewrites"]) and low.lint.findings == []
    for name in ("jp6.2-orin-nano", "jp7.2-orin-nano"):
        plan = run(BuildEngineRequest(root, PlanOptions(precision="fp32", target=name), dry_run=True)).plan
        assert plan.parse_graph is None and plan.precision_path == "strongly-typed"
