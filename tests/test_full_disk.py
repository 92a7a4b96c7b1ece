"""A full disk, a read-only one and a refused permission (issue 36): every command that writes exits 1 with
one line naming the folder (and for a full disk the space the write needed), no traceback, the bundle
byte-identical and no file left behind - neither ours nor a library's (ORT's quantizer writes
``model-inferred.onnx`` beside the graph it is given).

The disk is a real one: a 40 MB tmpfs mounted for the test (root only; skipped with the reason otherwise),
the digits bundle copied in, the rest filled to 200 KB free.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from vitdeploy.cli import main

FREE_BYTES = 200 << 10


def _mount_tmpfs(where: Path, size: str = "40m") -> str | None:
    """None when mounted, else why not."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root (run the suite as root, as CI does)"
    if shutil.which("mount") is None:
        return "no mount command on this machine"
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", f"vitdeploy-test-{uuid.uuid4().hex[:8]}", str(where)],
                          capture_output=True, text=True)
    return None if done.returncode == 0 else f"cannot mount a tmpfs here: {done.stderr.strip()}"


@pytest.fixture
def disk(tmp_path: Path):
    """A fresh 40 MB tmpfs, unmounted afterwards."""
    mount = tmp_path / "disk"
    why = _mount_tmpfs(mount)
    if why is not None:
        pytest.skip(why)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill(mount: Path, leave: int = FREE_BYTES) -> None:
    """Fill ``mount`` with one file until ``leave`` bytes are free."""
    st = os.statvfs(mount)
    with open(mount / "filler", "wb") as fh:
        os.posix_fallocate(fh.fileno(), 0, st.f_bavail * st.f_frsize - leave)


def snapshot(root: Path) -> dict[str, str]:
    """Every file (its sha256) and folder under ``root``, hidden ones included."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def cli(*args: object):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_error_line(result) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    assert result.output.rstrip().splitlines()[-1] == errors[0], result.output
    return errors[0]


@pytest.fixture
def full_bundle(disk: Path, digits_bundle):
    """(mount, bundle) - the digits bundle on a tmpfs with 200 KB free."""
    bundle = disk / "b"
    shutil.copytree(digits_bundle.root, bundle)
    fill(disk)
    return disk, bundle


# Every command that writes, with the cheapest options that still make it write what it always writes.
COMMANDS = {
    "export": ("export", "-o", "{b}"),
    "convert-fp16": ("convert", "{b}", "--precision", "fp16"),
    "convert-cpu": ("convert", "{b}", "--target", "cpu"),
    "calibrate": ("calibrate", "{b}", "--method", "minmax", "--samples", "16"),
    "check": ("check", "{b}", "--images", "8", "--limit", "32"),
    "evaluate": ("evaluate", "{b}", "--suite", "jpeg", "--limit", "32"),
    "profile": ("profile", "{b}", "--iterations", "3", "--warmup", "1", "--no-plot"),
    "build-engine-dry-run": ("build-engine", "{b}", "--dry-run", "--trt-version", "10.3"),
    "triton-repo": ("triton-repo", "{b}", "{m}/models"),
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_full_disk_is_one_line_and_leaves_nothing(full_bundle, name: str) -> None:
    mount, bundle = full_bundle
    before = snapshot(mount)
    line = one_error_line(cli(*(a.format(b=bundle, m=mount) for a in COMMANDS[name])))
    assert "not enough free space in " + str(mount) in line, line  # the folder: the mount or one inside it
    assert "KiB free" in line and "nothing was written" in line, line
    if name not in ("export",):
        assert "needs " in line, line  # what the write needed (export: refused before it knows the graph)
    assert snapshot(mount) == before  # the bundle byte-identical, and nothing new anywhere on the disk


@pytest.mark.parametrize("name", ["export", "convert-fp16", "calibrate", "check", "triton-repo"])
def test_a_read_only_disk_is_one_line_and_convert_fails_first(disk: Path, digits_bundle, name: str) -> None:
    bundle = disk / "b"
    shutil.copytree(digits_bundle.root, bundle)
    before = snapshot(disk)
    assert subprocess.run(["mount", "-o", "remount,ro", str(disk)], capture_output=True).returncode == 0
    result = cli(*(a.format(b=bundle, m=disk) for a in COMMANDS[name]))
    line = one_error_line(result)
    assert "read-only file system" in line and str(disk) in line, line
    if name in ("convert-fp16", "calibrate"):
        # refused before the range pass / the calibration: the error is all it printed
        assert result.output.strip() == line, result.output
    assert snapshot(disk) == before


def test_a_refused_permission_at_the_write_helper_is_one_line(digits_bundle, copy_bundle, monkeypatch) -> None:
    import tempfile

    import vitdeploy.fileio as fileio

    bundle = copy_bundle(digits_bundle)
    before = snapshot(bundle)

    def refuse(*args, dir=None, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(dir))

    monkeypatch.setattr(fileio.tempfile, "mkstemp", refuse)
    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    line = one_error_line(cli(*(a.format(b=bundle) for a in COMMANDS["build-engine-dry-run"])))
    assert line.startswith(f"error: no permission to write in {bundle}"), line
    assert snapshot(bundle) == before


def test_a_full_disk_inside_ort_quantizer_is_the_full_disk_not_a_decode_error(full_bundle, monkeypatch) -> None:
    """ORT's quantizer writes ``model-inferred.onnx`` beside its input and, on a full disk, re-reads it
    truncated (protobuf DecodeError). With the room check out of the way, that failure is reported as
    the full disk it is, and nothing of ORT's is left."""
    import vitdeploy.calibration.qdq as qdq
    from vitdeploy.bundle import Bundle
    from vitdeploy.calibration.sources import open_source
    from vitdeploy.errors import StorageError

    mount, bundle_dir = full_bundle
    os.unlink(mount / "filler")
    fill(mount, 300 << 10)  # room for a part of ORT's copy of the 575 KB graph, not all of it
    monkeypatch.setenv("VITDEPLOY_DISK_RESERVE", "0")
    monkeypatch.setattr(qdq, "require_space", lambda *a, **k: None)
    bundle = Bundle.open(bundle_dir)
    before = snapshot(mount)
    with pytest.raises(StorageError, match=r"not enough free space in .*: writing ONNX Runtime's calibration graphs needs about"):
        qdq.compute_ranges(bundle.artifact_path("fp32"), open_source(None, bundle, 16), "minmax", "tensorrt", bundle_dir / "ranges.json")
    assert snapshot(mount) == before  # no model-inferred.onnx, no augmented graph, no work folder


def test_the_line_names_the_visible_folder_and_the_size(tmp_path: Path) -> None:
    from vitdeploy.storage import storage_error

    hidden = tmp_path / ".model.fp16.onnx.staged.123.abc"
    text = str(storage_error(errno.ENOSPC, hidden, 3 << 20, "model.fp16.onnx", free=1 << 20))
    assert text.startswith(f"not enough free space in {tmp_path}: writing model.fp16.onnx needs about 3.0 MiB, 1.0 MiB free"), text
    assert "read-only" in str(storage_error(errno.EROFS, tmp_path))
    assert "quota" in str(storage_error(errno.EDQUOT, tmp_path, 10))
    assert "no permission to write in" in str(storage_error(errno.EACCES, tmp_path))


def test_a_library_write_no_helper_wrapped_is_found_in_the_cause_chain(tmp_path: Path) -> None:
    from vitdeploy.storage import storage_cause

    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x.onnx"))
        except OSError as exc:
            raise RuntimeError("a library's own wrapper") from exc
    except RuntimeError as exc:
        found = storage_cause(exc)
    assert found is not None and f"not enough free space in {tmp_path}" in str(found)
    assert storage_cause(RuntimeError("no cause")) is None
    assert storage_cause(OSError(errno.ENOENT, "missing", "x")) is None  # not a refused write: a bug keeps its traceback


def test_the_reserve_is_a_number_of_bytes(monkeypatch, tmp_path: Path) -> None:
    from vitdeploy.errors import StorageError, UserError
    from vitdeploy.storage import require_space

    monkeypatch.setenv("VITDEPLOY_DISK_RESERVE", "0")
    require_space(tmp_path, 10, free=10)  # fits exactly without a reserve
    monkeypatch.setenv("VITDEPLOY_DISK_RESERVE", "100")
    with pytest.raises(StorageError, match="vitdeploy leaves 100 B free"):
        require_space(tmp_path, 10, free=100)
    monkeypatch.setenv("VITDEPLOY_DISK_RESERVE", "1GB")
    with pytest.raises(UserError, match="VITDEPLOY_DISK_RESERVE must be a number of bytes"):
        require_space(tmp_path, 10, free=100)
