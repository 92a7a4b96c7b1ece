"""`--on HOST`: a real OpenSSH round trip to this machine through a throwaway sshd on 127.0.0.1.

The fixture starts Debian's sshd (scripts/install_system_deps.sh installs openssh-server) on a free
port of 127.0.0.1 with a host key and a user key made for the test, and points vitdeploy's ssh at it
through VITDEPLOY_SSH_OPTIONS (-F /dev/null, -i key, a known_hosts file in the tmp dir): the real
user's ~/.ssh is neither read nor written. The "device" is this machine; its vitdeploy is this
venv's, its bundle folder a tmp path.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest
from click.testing import CliRunner

from vitdeploy.cli import main
from vitdeploy.remote.target import SSH_OPTIONS_ENV, Target
from vitdeploy.errors import UserError
from waiting import HANG_GUARD_S, wait_until

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
VITDEPLOY = str(Path(sys.executable).parent / "vitdeploy")
# JetPack 5's Python as the device, where this machine has it (tests/test_device_subset.py makes and checks it)
PY38_VITDEPLOY = Path(__file__).resolve().parents[1] / ".venv-py38" / "bin" / "vitdeploy"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "vitdeploy-test", "-f", str(path)], check=True, timeout=30)


class Device:
    """A throwaway sshd on 127.0.0.1 and the ssh options that reach it."""

    def __init__(self, root: Path):
        self.root = root
        self.port = _free_port()
        self.user = getpass.getuser()
        self.key = root / "user_key"
        self.bad_key = root / "bad_key"
        _keygen(root / "host_key")
        _keygen(self.key)
        _keygen(self.bad_key)
        (root / "authorized_keys").write_text((root / "user_key.pub").read_text())
        os.chmod(root / "authorized_keys", 0o600)
        host_pub = (root / "host_key.pub").read_text().split()
        (root / "known_hosts").write_text(f"[127.0.0.1]:{self.port} {host_pub[0]} {host_pub[1]}\n")
        (root / "sshd_config").write_text("\n".join([
            f"Port {self.port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {root / 'host_key'}",
            f"PidFile {root / 'sshd.pid'}",
            f"AuthorizedKeysFile {root / 'authorized_keys'}",
            "StrictModes no",  # the tmp dir's owner/permissions are the test's, not a home directory's
            "UsePAM no",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",  # CI runs as root: key only
            f"AllowUsers {self.user}",
            "LogLevel ERROR",
            "",
        ]))
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
        self.log = open(root / "sshd.log", "wb")
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(root / "sshd_config")], stdout=self.log, stderr=subprocess.STDOUT)

        def listening() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {(root / 'sshd.log').read_text()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=5).close()
                return True
            except OSError:
                return False

        wait_until(listening, "sshd listening")

    def options(self, key: Path | None = None) -> str:
        return (f"-F /dev/null -i {key or self.key} -o IdentitiesOnly=yes -o UserKnownHostsFile={self.root / 'known_hosts'} "
                f"-o GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=yes -o LogLevel=ERROR")

    @property
    def on(self) -> str:
        return f"{self.user}@127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture(scope="module")
def device(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Device]:
    if not Path(SSHD).is_file() or shutil.which("ssh") is None:
        pytest.fail("OpenSSH (ssh, sshd) is missing: run `bash scripts/install_system_deps.sh` (make test does)")
    dev = Device(tmp_path_factory.mktemp("sshd"))
    yield dev
    dev.stop()


@pytest.fixture
def ssh_env(device: Device, monkeypatch: pytest.MonkeyPatch) -> Device:
    monkeypatch.setenv(SSH_OPTIONS_ENV, device.options())
    return device


def _tree(root: Path) -> Dict[str, str]:
    """Every file and its sha256, except the hash manifest each side keeps (.vitdeploy-hashes.json)."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".vitdeploy-hashes.json"}


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _shape(obj: Any) -> Any:
    """The structure of a JSON report (its keys, nested), not its measured values."""
    if isinstance(obj, dict):
        return {k: _shape(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_shape(obj[0])] if obj and isinstance(obj[0], (dict, list)) else "list"
    return "value"


PROFILE_ARGS = ("--iterations", "3", "--warmup", "1", "--threads", "1", "--no-plot")


@pytest.mark.slow
def test_profile_on_round_trips_and_a_second_run_copies_nothing(ssh_env: Device, digits_bundle: Any, copy_bundle: Any, tmp_path: Path):
    local_run = copy_bundle(digits_bundle, "local")
    remote_run = copy_bundle(digits_bundle, "remote")
    remote_dir = str(tmp_path / "device" / "digits")

    here = _invoke("profile", str(local_run), *PROFILE_ARGS)
    assert here.exit_code == 0, here.output
    first = _invoke("profile", str(remote_run), *PROFILE_ARGS, "--on", ssh_env.on, "--remote-vitdeploy", VITDEPLOY, "--remote-dir", remote_dir)
    assert first.exit_code == 0, first.output
    assert "copying" in first.output and "brought back" in first.output
    assert "p50 ms" in first.output and "ort fp32" in first.output  # the device's table streamed back

    # The reports came back into the local bundle, in the shape a local run writes them.
    local_reports, remote_reports = _tree(local_run / "reports"), _tree(remote_run / "reports")
    assert set(remote_reports) == set(local_reports) and "profile.json" in remote_reports, (remote_reports, local_reports)
    report_here = json.loads((local_run / "reports" / "profile.json").read_text())
    report_there = json.loads((remote_run / "reports" / "profile.json").read_text())
    for report in (report_here, report_there):
        report["machine"].pop("torch", None)  # recorded when torch is already imported (this pytest process), not by the CLI
    shape_here, shape_there = _shape(report_here), _shape(report_there)
    assert shape_there == shape_here
    assert json.loads((remote_run / "manifest.json").read_text()).keys() == json.loads((local_run / "manifest.json").read_text()).keys()
    assert [p.name for p in remote_run.rglob(".*")] == [".vitdeploy-hashes.json"], "no staging leftovers"
    # The device holds the same bundle (plus its hash manifest).
    assert _tree(remote_run) == _tree(Path(remote_dir) / "bundle")

    # A second run (a cheap one) finds the device's copy current, reports included: nothing is sent.
    second = _invoke("build-engine", str(remote_run), "--dry-run", "--trt-version", "10.3", "--on", ssh_env.on,
                     "--remote-vitdeploy", VITDEPLOY, "--remote-dir", remote_dir)
    assert second.exit_code == 0, second.output
    assert "bundle up to date" in second.output and "copying" not in second.output, second.output


def test_build_engine_dry_run_on_brings_back_the_plan(ssh_env: Device, digits_bundle: Any, copy_bundle: Any, tmp_path: Path):
    local_run = copy_bundle(digits_bundle, "local")
    remote_run = copy_bundle(digits_bundle, "remote")
    args = ("--dry-run", "--trt-version", "10.3", "--precision", "fp32", "--target", "orin-trt10.3-fp32")
    here = _invoke("build-engine", str(local_run), *args)
    assert here.exit_code == 0, here.output
    device_vitdeploy = str(PY38_VITDEPLOY) if PY38_VITDEPLOY.exists() else VITDEPLOY
    there = _invoke("build-engine", str(remote_run), *args, "--on", ssh_env.on, "--remote-vitdeploy", device_vitdeploy,
                    "--remote-dir", str(tmp_path / "device"))
    assert there.exit_code == 0, there.output
    if PY38_VITDEPLOY.exists():
        assert "Python 3.8" in there.output  # a workstation on 3.11 driving a JetPack 5-like 3.8 device
    plan_here = json.loads((local_run / "reports" / "engine-plan-orin-trt10.3-fp32.json").read_text())
    plan_there = json.loads((remote_run / "reports" / "engine-plan-orin-trt10.3-fp32.json").read_text())
    assert _shape(plan_there) == _shape(plan_here)
    # Same bundle, same options: the same plan, except that it names the graph where it was read.
    source_here, source_there = plan_here["plan"].pop("source"), plan_there["plan"].pop("source")
    assert plan_there["plan"] == plan_here["plan"]
    assert source_there == str(tmp_path / "device" / "bundle" / Path(source_here).name)


@pytest.mark.slow
def test_external_data_travels_both_ways(ssh_env: Device, export_cached: Any, copy_bundle: Any, tmp_path: Path):
    """A bundle whose graphs keep their weights in <graph>.onnx.data (issue 32): the device gets both
    files, lowers for TensorRT 8.6 there, and the lowered graph comes back with its own data file."""
    from vitdeploy import onnx_io

    bundle = export_cached("builtin:digits", precisions=("fp32", "fp16"), check_images=16, external_data_threshold=0)
    local = copy_bundle(bundle, "ext")
    remote_dir = tmp_path / "device"
    result = _invoke("build-engine", str(local), "--dry-run", "--trt-version", "8.6", "--precision", "fp16", "--on", ssh_env.on,
                     "--remote-vitdeploy", VITDEPLOY, "--remote-dir", str(remote_dir))
    assert result.exit_code == 0, result.output
    device_copy = remote_dir / "bundle"
    assert {"model.onnx.data", "model.fp16.onnx.data"} <= {p.name for p in device_copy.iterdir()}
    manifest = json.loads((local / "manifest.json").read_text())
    lowered = manifest["parser_graphs"]["fp16@trt8.6"]
    assert lowered["data"]["file"] == "model.fp16.trt8.6.onnx.data"
    assert onnx_io.check_files(local, lowered) == []  # both files back, as the device recorded them
    assert _tree(local) == _tree(device_copy)


def _descendants(pid: int) -> list[int]:
    """Processes below ``pid`` (from /proc): the sessions our own test sshd forked."""
    children: Dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@pytest.mark.slow
def test_lost_connection_mid_copy_leaves_both_sides_intact(ssh_env: Device, digits_bundle: Any, copy_bundle: Any, tmp_path: Path):
    """The link dies part-way through each copy: nothing half-written appears on either side."""
    bundle = copy_bundle(digits_bundle, "remote")
    remote_dir = tmp_path / "device"
    marker = tmp_path / "mid-copy"
    # A "device vitdeploy" whose upload breaks off after 20 kB (the device's end goes away), and whose
    # download stops after 1 kB and waits there (an hour: however slow the killer is, it is still mid-stream),
    # so the test can kill the ssh connection mid-stream.
    flaky = tmp_path / "flaky-vitdeploy"
    flaky.write_text(f"""#!/bin/sh
if [ "$1" = remote-agent ] && [ "$2" = receive ]; then head -c 20000 | "{VITDEPLOY}" "$@"; exit 1; fi
if [ "$1" = remote-agent ] && [ "$2" = send ]; then "{VITDEPLOY}" "$@" | {{ head -c 1024; touch "{marker}"; sleep 3600; }}; exit 1; fi
exec "{VITDEPLOY}" "$@"
""")
    flaky.chmod(0o755)
    dry_run = ("build-engine", str(bundle), "--dry-run", "--on", ssh_env.on, "--remote-dir", str(remote_dir))

    before = _tree(bundle)
    up = _invoke(*dry_run, "--trt-version", "10.3", "--remote-vitdeploy", str(flaky))
    assert up.exit_code == 1
    assert "copying the bundle" in up.output and "stopped part-way" in up.output and "Traceback" not in up.output, up.output
    assert _tree(bundle) == before
    # the device kept nothing half-copied: only its (empty) hash manifest, no staging folder
    assert [p.name for p in (remote_dir / "bundle").iterdir()] == [".vitdeploy-hashes.json"]

    ok = _invoke(*dry_run, "--trt-version", "10.3", "--remote-vitdeploy", VITDEPLOY)  # an intact round trip
    assert ok.exit_code == 0, ok.output
    before = _tree(bundle)

    def kill_when_mid_copy() -> None:
        deadline = time.monotonic() + HANG_GUARD_S  # a hang guard: the copy below must not wait forever
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in _descendants(ssh_env.proc.pid):  # the connection's sshd processes and what they run
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    killer = threading.Thread(target=kill_when_mid_copy)
    killer.start()
    down = _invoke(*dry_run, "--trt-version", "10.3", "--target", "other", "--remote-vitdeploy", str(flaky))  # a new report to bring back
    killer.join()
    assert marker.exists()
    assert down.exit_code == 1
    assert "bringing back the results" in down.output and "nothing changed here" in down.output, down.output
    assert _tree(bundle) == before
    assert [p.name for p in bundle.rglob(".*")] == [".vitdeploy-hashes.json"], "no staging leftovers"


def test_one_line_errors(ssh_env: Device, digits_bundle: Any, copy_bundle: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    bundle = str(copy_bundle(digits_bundle))  # an --on run keeps its hash manifest in the local bundle
    common = ("--dry-run", "--remote-dir", str(tmp_path / "device"))

    def error_line(*args: str) -> str:
        result = _invoke("build-engine", bundle, *common, *args)
        assert result.exit_code == 1, result.output
        lines = [l for l in result.output.splitlines() if l.startswith("error:")]
        assert len(lines) == 1 and "Traceback" not in result.output, result.output
        return lines[0]

    # nothing listens on this port
    assert "cannot reach" in error_line("--on", f"127.0.0.1:{_free_port()}", "--remote-vitdeploy", VITDEPLOY)
    # a key the device does not accept
    monkeypatch.setenv(SSH_OPTIONS_ENV, ssh_env.options(ssh_env.bad_key))
    assert "refused the login" in error_line("--on", ssh_env.on, "--remote-vitdeploy", VITDEPLOY)
    monkeypatch.setenv(SSH_OPTIONS_ENV, ssh_env.options())
    # no vitdeploy there
    line = error_line("--on", ssh_env.on, "--remote-vitdeploy", str(tmp_path / "nowhere" / "vitdeploy"))
    assert "no runnable vitdeploy" in line and "--remote-vitdeploy" in line
    # the device's vitdeploy writes another bundle format
    skewed = tmp_path / "skewed-vitdeploy"
    skewed.write_text(f"""#!/bin/sh
if [ "$1" = remote-agent ] && [ "$2" = hello ]; then
  "{VITDEPLOY}" "$@" | sed 's#vitdeploy-bundle/1#vitdeploy-bundle/2#; s#"vitdeploy_version": "[^"]*"#"vitdeploy_version": "9.9"#'; exit 0
fi
exec "{VITDEPLOY}" "$@"
""")
    skewed.chmod(0o755)
    line = error_line("--on", ssh_env.on, "--remote-vitdeploy", str(skewed))
    assert "version skew" in line and "vitdeploy-bundle/2" in line and "9.9" in line


def test_target_parsing():
    assert Target.parse("nvidia@orin.local:2222") == Target("orin.local", "nvidia", 2222)
    assert Target.parse("jetson") == Target("jetson")
    assert Target.parse("[fe80::1]:22") == Target("fe80::1", None, 22)
    assert str(Target.parse("me@[::1]:2200")) == "me@[::1]:2200"
    for bad in ("", "@host", "host:0", "host:99999", "host:ssh", "-oProxyCommand=x"):
        with pytest.raises(UserError):
            Target.parse(bad)


def test_remote_options_need_on():
    result = _invoke("predict", "b", "x.png", "--remote-dir", "/tmp/x")
    assert result.exit_code == 1 and "only mean something with --on" in result.output


def test_command_line_rebuilt_for_the_device(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """What the user set travels (defaults are left to the device's vitdeploy); paths are mapped under ROOT/work."""
    import vitdeploy.remote.session as session

    seen: list = []

    def fake_run(request: Any, **_: Any) -> Any:
        seen.append(request)
        return session.RemoteOutcome(returncode=0, uploaded=[], downloaded=[], device={})

    monkeypatch.setattr(session, "run", fake_run)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.png").write_bytes(b"x")
    absolute = tmp_path / "dog.png"
    absolute.write_bytes(b"x")

    assert _invoke("predict", "b", "photos/cat.png", str(absolute), "--top-k", "3", "--json", "--on", "jetson").exit_code == 0
    req = seen[-1]
    assert (req.command, req.bundle, req.on) == ("predict", "b", "jetson")
    assert req.options == ["--top-k", "3", "--json"]
    assert req.positionals == ["photos/cat.png", "_abs" + absolute.as_posix()]
    assert [(p.rel, p.upload, p.download) for p in req.paths] == [("photos/cat.png", True, False), ("_abs" + absolute.as_posix(), True, False)]

    assert _invoke("profile", "b", "--batch", "1,8", "-o", "out", "--no-plot", "--on", "me@orin:2222").exit_code == 0
    req = seen[-1]
    assert req.options == ["--batch", "1,8", "--output", "out", "--no-plot"]
    assert [(p.rel, p.upload, p.download) for p in req.paths] == [("out", False, True)]

    assert _invoke("build-engine", "b", "--batch", "1:8:32", "--batch", "1:1:1", "--timing-cache", "t.cache",
                   "--on", "orin", "--remote-vitdeploy", "~/venv/bin/vitdeploy").exit_code == 0
    req = seen[-1]
    assert req.options == ["--batch", "1:8:32", "--batch", "1:1:1", "--timing-cache", "t.cache"]
    assert req.remote_vitdeploy == "~/venv/bin/vitdeploy"
    assert [(p.rel, p.download) for p in req.paths] == [("t.cache", True)]

    (tmp_path / "b").mkdir()  # check's BUNDLE must exist here
    assert _invoke("check", "b", "--precision", "fp32", "--data", "digits:test", "--on", "jetson").exit_code == 0
    assert (seen[-1].options, seen[-1].paths) == (["--precision", "fp32", "--data", "digits:test"], [])  # a data spec, not a path
    assert _invoke("check", "b", "--data", "photos", "--on", "jetson").exit_code == 0
    assert [(p.rel, p.upload, p.download) for p in seen[-1].paths] == [("photos", True, False)]  # a folder of labelled images

    # profile --layers with files trtexec wrote elsewhere: they travel to the device with the command
    (tmp_path / "prof.json").write_text("[]")
    (tmp_path / "run.log").write_text("")
    assert _invoke("profile", "b", "--layers", "--layer-profile", "prof.json", "--trtexec-log", "run.log", "--on", "orin").exit_code == 0
    assert seen[-1].options == ["--layers", "--layer-profile", "prof.json", "--trtexec-log", "run.log"]
    assert [(p.rel, p.upload, p.download) for p in seen[-1].paths] == [("prof.json", True, False), ("run.log", True, False)]

    missing = _invoke("predict", "b", "nope.png", "--on", "jetson")
    assert missing.exit_code == 1 and "no such file or folder here" in missing.output


def test_engine_fingerprint_names_the_machine_that_built_it():
    from types import SimpleNamespace

    from vitdeploy.engine import fingerprint

    plan = SimpleNamespace(precision="fp16", precision_path="strongly-typed", builder_flags=(), input_name="images",
                           input_dtype="uint8", input_layout="NHWC", hardware_compatibility="none", version_compatible=False,
                           dla_core=None, gpu_fallback=True, source_sha256="0" * 64, source_precision="fp16",
                           to_dict=lambda: {"profiles": []})
    record = fingerprint.make_fingerprint(plan, fingerprint.DeviceInfo("Orin", "8.7"), "10.3.0", "1" * 64, 10, 1.0)
    assert record["built_on"] == socket.gethostname()


def test_predict_on_copies_the_images_and_answers_like_a_local_run(ssh_env: Device, digits_bundle: Any, copy_bundle: Any,
                                                                   tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import numpy as np
    from PIL import Image

    monkeypatch.chdir(tmp_path)
    (tmp_path / "imgs").mkdir()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(tmp_path / "imgs" / "a.png")
    bundle = copy_bundle(digits_bundle)  # an --on run keeps its hash manifest in the local bundle
    args = ("predict", str(bundle), "imgs/a.png", "--top-k", "2", "--json", "--backend", "onnxruntime")
    here = _invoke(*args)
    there = _invoke(*args, "--on", ssh_env.on, "--remote-vitdeploy", VITDEPLOY, "--remote-dir", str(tmp_path / "device"))
    assert here.exit_code == 0 and there.exit_code == 0, there.output
    assert json.loads(there.stdout) == json.loads(here.stdout)  # same image name, same answer
    assert (tmp_path / "device" / "work" / "imgs" / "a.png").read_bytes() == (tmp_path / "imgs" / "a.png").read_bytes()


def test_ctrl_c_on_the_workstation_stops_the_command_on_the_device(ssh_env: Device, digits_bundle: Any, copy_bundle: Any, tmp_path: Path):
    """ssh without a terminal passes no signal on: the device's agent stops the command when the connection closes."""
    bundle = copy_bundle(digits_bundle)
    before = _tree(bundle)
    remote_dir = tmp_path / "device"
    proc = subprocess.Popen(
        [VITDEPLOY, "profile", str(bundle), "--duration", "3600", "--warmup", "1", "--threads", "1", "--no-plot", "--json",  # silent for an hour
         "--on", ssh_env.on, "--remote-vitdeploy", VITDEPLOY, "--remote-dir", str(remote_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=dict(os.environ, **{SSH_OPTIONS_ENV: ssh_env.options()}),
        # a pytest-xdist worker ignores SIGINT and children inherit that; a shell hands vitdeploy the default
        start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def on_device() -> list[int]:
        """The profile run the agent started (its command line is the agent's, naming the device's bundle)."""
        found = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "from vitdeploy.cli import main" in text and f"{remote_dir}/bundle" in text:
                found.append(int(cmdline.parent.name))
        return found

    try:
        wait_until(lambda: on_device() or proc.poll() is not None, "the profile run starting on the device", poll_s=0.2)
        assert on_device(), "the profile run never started on the device"
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
        output = proc.communicate(timeout=HANG_GUARD_S)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, output
    assert "interrupted" in output and "Traceback" not in output, output
    # an hour-long profile that ends within the hang guard was stopped: counted by its duration, not timed
    wait_until(lambda: not on_device(), "the command on the device stopping", poll_s=0.2)
    assert _tree(bundle) == before  # nothing came back half-way


def test_agent_stops_the_command_when_its_connection_closes(digits_bundle: Any, copy_bundle: Any, tmp_path: Path):
    """The mechanism behind the test above, without ssh: the agent's stdin is the connection."""
    bundle = copy_bundle(digits_bundle)
    agent = subprocess.Popen([VITDEPLOY, "remote-agent", "run", str(tmp_path), "--", "profile", str(bundle), "--duration", "3600",
                              "--warmup", "1", "--threads", "1", "--no-plot", "--json"],  # silent for an hour: no broken pipe to die of
                             stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def children() -> list[int]:
        return [pid for pid in _descendants(agent.pid)
                if b"from vitdeploy.cli import main" in Path(f"/proc/{pid}/cmdline").read_bytes()] if agent.poll() is None else []

    try:
        started = wait_until(lambda: children() or agent.poll() is not None, "the command starting under the agent", poll_s=0.1)
        assert started is not True, "the command did not start"
        agent.stdin.close()  # the workstation went away
        returncode = agent.wait(timeout=HANG_GUARD_S)  # the command runs for an hour unless the agent stops it
    finally:
        if agent.poll() is None:
            agent.kill()
    assert returncode == 128 + signal.SIGTERM, agent.stderr.read()
    assert not any(Path(f"/proc/{pid}").exists() for pid in started)
