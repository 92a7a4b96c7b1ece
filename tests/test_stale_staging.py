"""What a killed command leaves (issue 36): SIGKILL runs no clean-up, so the next run of any command on
that bundle removes the staging folders and temporary files whose writer is gone - named
``.NAME.KIND.PID.*`` for that - and leaves a live concurrent writer's alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from vitdeploy.cli import main
from vitdeploy.fileio import remove_stale

KILL_POINT = Path(__file__).with_name("kill_point.py")


def hidden(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*"))


def backdate_an_hour(path: Path) -> None:
    """Set ``path``'s times an hour before it was made: relative to its own mtime, so no clock is read."""
    an_hour_before = path.stat().st_mtime - 3600
    os.utime(path, (an_hour_before, an_hour_before))


def test_a_dead_writers_leftovers_go_and_a_live_ones_stay(tmp_path: Path) -> None:
    dead = 999999999  # above any pid_max
    live = os.getppid()
    for name in (f".model.fp16.onnx.staged.{dead}.ab12", f".b.staging.{dead}.x", f".calibrate.work.{dead}.y"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.onnx").write_bytes(b"partial")
    (tmp_path / f".check.json.tmp.{dead}.z1").write_bytes(b"{")
    (tmp_path / f".model.fp16.onnx.staged.{live}.cd34").mkdir()  # a concurrent convert's
    (tmp_path / f".check.json.tmp.{os.getpid()}.q").write_bytes(b"{")  # this process's own
    (tmp_path / ".user-notes.txt").write_text("not ours")  # a hidden file of the user's
    (tmp_path / "model.onnx").write_bytes(b"graph")
    removed = remove_stale(tmp_path)
    assert sorted(p.name for p in removed) == sorted([f".model.fp16.onnx.staged.{dead}.ab12", f".b.staging.{dead}.x",
                                                      f".calibrate.work.{dead}.y", f".check.json.tmp.{dead}.z1"])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f".model.fp16.onnx.staged.{live}.cd34", f".check.json.tmp.{os.getpid()}.q",
                                                                  ".user-notes.txt", "model.onnx"])


def test_a_pid_the_system_reused_is_not_the_writer(tmp_path: Path) -> None:
    if not Path("/proc/self/stat").is_file():
        pytest.skip("process start times come from /proc (Linux)")
    later = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        left = tmp_path / f".model.fp16.onnx.staged.{later.pid}.ab12"
        left.mkdir()
        backdate_an_hour(left)  # written long before that process started
        assert remove_stale(tmp_path) == [left]
    finally:
        later.communicate(b"")


def test_a_leftover_named_before_pids_were_goes_when_older_than_this_process(tmp_path: Path) -> None:
    old = tmp_path / ".model.fp16.onnx.k2j4h5g6.staged"  # what convert named its staging folder before issue 36
    old.mkdir()
    backdate_an_hour(old)  # left by a run before this process
    assert remove_stale(tmp_path) == [old]


def _killed_at_first_rename(bundle: Path, *args: object) -> None:
    """Run ``vitdeploy ARGS`` until its first rename of a staged file in ``bundle``, then SIGKILL it."""
    env = dict(os.environ, VITDEPLOY_ORT_THREADS="1", KILL_POINT_UNDER=str(bundle))
    proc = subprocess.Popen([sys.executable, str(KILL_POINT), *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)
    try:
        for line in proc.stdout:  # the event: it stopped at the rename (no sleep, no timing)
            if line.strip() == "READY":
                break
        else:
            pytest.fail(f"it ended before writing anything: {proc.communicate()}")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=120)


def _same_command_again_leaves_nothing(bundle: Path, *args: object) -> None:
    left = hidden(bundle)
    assert left, "SIGKILL cannot be cleaned up after: a staging folder or temporary file stays ..."
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    assert hidden(bundle) == [], "... until the next run on that bundle"


@pytest.mark.slow
def test_kill_9_during_convert_then_convert_leaves_no_staging(digits_bundle, copy_bundle) -> None:
    bundle = copy_bundle(digits_bundle)
    _killed_at_first_rename(bundle, "convert", bundle, "--precision", "fp16")
    assert any(".model.fp16.onnx.staged." in name for name in hidden(bundle))
    _same_command_again_leaves_nothing(bundle, "convert", bundle, "--precision", "fp16")


@pytest.mark.slow
def test_kill_9_during_calibrate_then_calibrate_leaves_no_staging(digits_bundle, copy_bundle) -> None:
    bundle = copy_bundle(digits_bundle)
    args = ("calibrate", bundle, "--method", "minmax", "--samples", "16")
    _killed_at_first_rename(bundle, *args)
    assert any(name.startswith(".calibrate.work.") for name in hidden(bundle))
    _same_command_again_leaves_nothing(bundle, *args)


@pytest.mark.slow
def test_kill_9_during_evaluate_then_evaluate_leaves_no_staging(digits_bundle, copy_bundle) -> None:
    bundle = copy_bundle(digits_bundle)
    args = ("evaluate", bundle, "--suite", "jpeg", "--limit", "32", "--no-plot")
    _killed_at_first_rename(bundle, *args)
    assert any(name.startswith("reports/.evaluate.") for name in hidden(bundle))
    _same_command_again_leaves_nothing(bundle, *args)


def test_any_command_on_the_bundle_removes_them(digits_bundle, copy_bundle) -> None:
    bundle = copy_bundle(digits_bundle)
    (bundle / "reports").mkdir(exist_ok=True)
    (bundle / ".model.fp16.onnx.staged.999999999.ab12").mkdir()
    (bundle / "reports" / ".evaluate.json.tmp.999999999.x1").write_text("{")
    (bundle.parent / f".{bundle.name}.staging.999999999.zz").mkdir()  # a killed export's, beside it
    result = CliRunner().invoke(main, ["inspect", str(bundle)])  # a command that writes nothing
    assert result.exit_code == 0, result.output
    assert hidden(bundle) == [] and not list(bundle.parent.glob(f".{bundle.name}.*"))
