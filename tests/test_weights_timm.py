"""Issue 26: `timm:` sources load the published weights through timm's own loader, from a real
Hugging Face cache written here (no network on this machine), and never random ones silently.

The cache holds seeded models in huggingface_hub's layout (tests/hf_cache.py). CLI runs are real
processes with HF_HOME/HF_HUB_OFFLINE in their environment (huggingface_hub reads them at import);
in-process loads patch the constants the library reads (hf_cache.offline_hub).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hf_cache import hub_env, offline_hub, repo_folder, timm_hub_folder, write_folder, write_snapshot, write_state_dict

from vitdeploy.errors import UserError
from vitdeploy.fileio import sha256_file
from vitdeploy.preprocess import random_images

CLI = Path(sys.executable).with_name("vitdeploy")
DEIT = "deit_tiny_patch16_224.fb_in1k"
TINY = "test-org/tiny-vit"  # a timm hf-hub: model (config.json with model_args + model.safetensors)
TINY_ARGS = {"depth": 2, "img_size": 64, "num_classes": 5}


def _trained_like(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Seeded weights far from timm's init (a head that gives large logits), so a random init cannot pass for them."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("head") and name.endswith("weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif p.dim() >= 2:
                p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    return model.eval()


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> dict:
    """HF_HOME with timm's DeiT-Tiny (full size, for the acceptance command) and a small hf-hub: ViT at two revisions."""
    import timm

    home = tmp_path_factory.mktemp("hf-home")
    deit = _trained_like(timm.create_model("deit_tiny_patch16_224", pretrained=False), seed=2)
    deit_commit = write_state_dict(home, f"timm/{DEIT}", deit)
    tiny = _trained_like(timm.create_model("vit_tiny_patch16_224", pretrained=False, **TINY_ARGS), seed=3)
    folder = timm_hub_folder(tiny, tmp_path_factory.mktemp("tiny-folder"), TINY_ARGS)
    config = json.loads((folder / "config.json").read_text())
    config["pretrained_cfg"].update(mean=[0.25, 0.5, 0.75], std=[0.2, 0.3, 0.4], crop_pct=0.875,
                                    label_names=[f"label{i}" for i in range(5)])
    (folder / "config.json").write_text(json.dumps(config))
    tiny_commit = write_folder(home, TINY, folder)
    # a later revision on a branch, with other weights: pinning must pick the one asked for
    other = _trained_like(timm.create_model("vit_tiny_patch16_224", pretrained=False, **TINY_ARGS), seed=4)
    other_folder = timm_hub_folder(other, tmp_path_factory.mktemp("tiny-other"), TINY_ARGS)
    (other_folder / "config.json").write_text(json.dumps(config))
    other_commit = write_snapshot(home, TINY, {p.name: p for p in other_folder.iterdir()}, ref="v2")
    return {"home": home, "deit": deit, "deit_commit": deit_commit, "tiny": tiny, "tiny_commit": tiny_commit,
            "other": other, "other_commit": other_commit}


def _cli(*args: str, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(CLI), *args], capture_output=True, text=True, env=env, timeout=timeout)


def _lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]


def _torch_logits(model: torch.nn.Module, images: np.ndarray, mean, std) -> np.ndarray:
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0
    x = (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    with torch.no_grad():
        return model(x).numpy()


def _ort_logits(bundle_dir: Path, images: np.ndarray) -> np.ndarray:
    from vitdeploy.runtime.ort import OrtRunner

    with OrtRunner(bundle_dir / "model.onnx") as runner:
        return runner.infer(images)["logits"]


# -- the acceptance command -------------------------------------------------------------------------
@pytest.mark.slow
def test_published_deit_from_the_offline_cache(cache, tmp_path):
    """`vitdeploy export timm:deit_tiny_patch16_224.fb_in1k -o b` with the model cached and HF_HUB_OFFLINE=1."""
    import onnx

    out = tmp_path / "b"
    proc = _cli("export", f"timm:{DEIT}", "-o", str(out), "--check-images", "4", env=hub_env(cache["home"]))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    file = repo_folder(cache["home"], f"timm/{DEIT}") / "snapshots" / cache["deit_commit"] / "model.safetensors"
    manifest = json.loads((out / "manifest.json").read_text())
    weights = manifest["source"]["weights"]
    assert weights == {"origin": "hf-hub", "repo_id": f"timm/{DEIT}", "requested_revision": None,
                       "revision": cache["deit_commit"], "file": "model.safetensors", "sha256": sha256_file(file)}
    assert manifest["source"]["random_init"] is False and manifest["source"]["weights_sha256"] == sha256_file(file)
    assert f"timm/{DEIT}@{cache['deit_commit']}" in proc.stderr  # the export says which weights (a log line: stderr)
    # the identity travels inside model.onnx too
    meta = {p.key: p.value for p in onnx.load(str(out / "model.onnx"), load_external_data=False).metadata_props}
    assert json.loads(meta["vitdeploy.source"])["weights"] == weights
    # the graph computes the cached weights, and not a random init
    images = random_images(6, 224, 224, seed=5)
    got = _ort_logits(out, images)
    pre = manifest["preprocessing"]
    want = _torch_logits(cache["deit"], images, pre["mean"], pre["std"])
    assert np.abs(got - want).max() <= 1e-4
    import timm

    torch.manual_seed(0)
    random = timm.create_model("deit_tiny_patch16_224", pretrained=False).eval()
    assert np.abs(got - _torch_logits(random, images, pre["mean"], pre["std"])).max() > 1.0
    assert len(manifest["labels"]) == 1000 and len(set(manifest["labels"])) == 1000  # ImageNet names, one-to-one


# -- refusals ------------------------------------------------------------------------------------------
@pytest.mark.slow  # a CLI process or whole exports
def test_uncached_model_is_refused_in_one_line_and_writes_nothing(cache, tmp_path):
    out = tmp_path / "b"
    proc = _cli("export", "timm:vit_small_patch16_224.augreg_in21k_ft_in1k", "-o", str(out), env=hub_env(cache["home"]))
    assert proc.returncode == 1
    (line,) = _lines(proc)
    assert line.startswith("error: ") and "timm/vit_small_patch16_224.augreg_in21k_ft_in1k" in line
    for hint in ("HF_HUB_OFFLINE=1", "--checkpoint FILE", "--random-init", "hf download"):
        assert hint in line, line
    assert not out.exists()


class SilentHub:
    """A hub endpoint that accepts connections and never answers: the kernel completes each TCP
    handshake into the listen backlog and nothing reads or replies. After the client has exited,
    ``connections()`` takes every connection it made out of the backlog with the request it sent,
    so a test counts the attempts (each costs up to HF_HUB_ETAG_TIMEOUT) instead of timing them."""

    BACKLOG = 64  # more than any client here makes; a retrying one shows up as a count above one

    def __enter__(self) -> "SilentHub":
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(self.BACKLOG)
        self.endpoint = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        return self

    def connections(self) -> list[str]:
        """The first line each connection sent ('' for one that sent nothing), in the order made."""
        self.sock.setblocking(False)
        lines = []
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return lines
            with conn:
                conn.setblocking(False)
                try:
                    lines.append(conn.recv(65536).decode(errors="replace").split("\r\n", 1)[0])
                except (BlockingIOError, ConnectionResetError):
                    lines.append("")

    def __exit__(self, *exc) -> None:
        self.sock.close()


@pytest.mark.slow  # a CLI process or whole exports
def test_unreachable_hub_refuses_within_bounded_time(cache, tmp_path):
    """No HF_HUB_OFFLINE, no cached copy, and a hub that accepts connections but never answers:
    one probe with HF_HUB_ETAG_TIMEOUT, then the cache only, so the refusal comes at once, in one line.

    What bounds the time is counted, not timed: exactly one connection to the hub (the metadata probe,
    cut off after HF_HUB_ETAG_TIMEOUT), no retry and no download attempt. huggingface_hub alone retries
    each file five times with back-off (timm's loader took 772 s against such an endpoint, docs/BENCHMARKS.md)."""
    repo = "timm/vit_small_patch16_224.augreg_in21k_ft_in1k"
    with SilentHub() as hub:
        env = hub_env(cache["home"], offline=False, HF_ENDPOINT=hub.endpoint, HF_HUB_ETAG_TIMEOUT="2", HF_HUB_DOWNLOAD_TIMEOUT="2")
        proc = _cli("export", f"timm:{repo.split('/', 1)[1]}", "-o", str(tmp_path / "b"), env=env)
        requests = hub.connections()
    assert proc.returncode == 1
    (line,) = _lines(proc)
    assert "cannot be reached" in line and repo in line and "--random-init" in line
    assert len(requests) == 1, requests  # one probe, no retries
    assert requests[0].startswith(f"GET /api/models/{repo}"), requests  # the model-info probe
    assert not (tmp_path / "b").exists()


@pytest.mark.slow  # a CLI process or whole exports
def test_unreachable_hub_still_loads_a_cached_model(cache, tmp_path):
    with SilentHub() as hub:
        env = hub_env(cache["home"], offline=False, HF_ENDPOINT=hub.endpoint, HF_HUB_ETAG_TIMEOUT="2")
        proc = _cli("export", f"timm:hf-hub:{TINY}", "-o", str(tmp_path / "b"), "--check-images", "2", "--no-simplify", env=env)
        requests = hub.connections()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "cannot be reached" in proc.stderr and "from the cache" in proc.stderr  # a log line: stderr
    assert len(requests) == 1 and requests[0].startswith(f"GET /api/models/{TINY}"), requests  # the probe, then the cache only
    weights = json.loads((tmp_path / "b" / "manifest.json").read_text())["source"]["weights"]
    assert weights["revision"] == cache["tiny_commit"]


@pytest.mark.parametrize("source, args, message", [
    (f"timm:{DEIT.split('.')[0]}.nope", [], "timm has no pretrained tag 'nope' for deit_tiny_patch16_224; published: deit_tiny_patch16_224.fb_in1k"),
    ("timm:vit_base_patch16_gap_224", [], "timm publishes no weights for vit_base_patch16_gap_224"),
    ("timm:vit_small_patch16_18x2_224", ["--random-init"], "is built of ParallelThingsBlock blocks"),
    (f"timm:{DEIT}", ["--num-classes", "10"], "--num-classes 10 would add a random head"),
    (f"timm:{DEIT}", ["--random-init", "--checkpoint", "x.safetensors"], "--random-init and --checkpoint exclude each other"),
    ("builtin:digits", ["--random-init"], "--random-init applies to timm: and hf: sources"),
])
def test_ways_to_random_weights_are_refused(tmp_path, source, args, message):
    from click.testing import CliRunner

    from vitdeploy.cli import main

    result = CliRunner().invoke(main, ["export", source, "-o", str(tmp_path / "b"), *args])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert message in result.output, result.output
    assert not (tmp_path / "b").exists()


def test_published_weights_that_do_not_fit_the_model_args(cache, monkeypatch):
    from vitdeploy.exporters.sources import load_source

    offline_hub(monkeypatch, cache["home"])
    with pytest.raises(UserError) as err:
        load_source(f"timm:hf-hub:{TINY}", model_kwargs={"depth": 1})
    assert "the published weights do not fit the model built with {'depth': 1}" in str(err.value)
    assert "\n" not in str(err.value)


# -- what is loaded, pinned and recorded ------------------------------------------------------------------
def test_hf_hub_name_loads_the_cached_file_with_its_config(cache, monkeypatch):
    from vitdeploy.exporters.sources import load_source

    offline_hub(monkeypatch, cache["home"])
    loaded = load_source(f"timm:hf-hub:{TINY}")
    assert loaded.source["weights"]["revision"] == cache["tiny_commit"]
    assert loaded.labels == [f"label{i}" for i in range(5)]  # the weight's own label names
    assert loaded.preprocessing["mean"] == [0.25, 0.5, 0.75] and loaded.preprocessing["std"] == [0.2, 0.3, 0.4]
    assert loaded.preprocessing["host_resize"]["crop_pct"] == 0.875
    images = random_images(4, 64, 64, seed=1)
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float()
    with torch.no_grad():
        assert torch.equal(loaded.model(x), cache["tiny"](x))


def test_revision_is_pinned_and_a_missing_one_refused(cache, monkeypatch):
    from vitdeploy.exporters.sources import load_source

    offline_hub(monkeypatch, cache["home"])
    loaded = load_source(f"timm:hf-hub:{TINY}@v2")
    weights = loaded.source["weights"]
    assert weights["requested_revision"] == "v2" and weights["revision"] == cache["other_commit"]
    x = torch.from_numpy(random_images(2, 64, 64, seed=2)).permute(0, 3, 1, 2).float()
    with torch.no_grad():
        assert torch.equal(loaded.model(x), cache["other"](x))
    with pytest.raises(UserError) as err:
        load_source(f"timm:hf-hub:{TINY}@v3")
    assert f"hub repository {TINY}@v3" in str(err.value) and "--random-init" in str(err.value)


@pytest.mark.slow  # a CLI process or whole exports
def test_reexport_gives_the_same_bytes_and_check_reloads_the_recorded_revision(cache, monkeypatch, tmp_path):
    from vitdeploy.bundle import Bundle
    from vitdeploy.exporters import ExportOptions, export, loaded_for_bundle

    offline_hub(monkeypatch, cache["home"])
    options = ExportOptions(check_images=2, simplify=False)
    first = export(f"timm:hf-hub:{TINY}", tmp_path / "a", options)
    second = export(f"timm:hf-hub:{TINY}", tmp_path / "b", options)
    assert sha256_file(first.artifact_path("fp32")) == sha256_file(second.artifact_path("fp32"))
    # main moves on to other weights: the bundle's reference is still its own revision
    (repo_folder(cache["home"], TINY) / "refs" / "main").write_text(cache["other_commit"])
    try:
        loaded = loaded_for_bundle(Bundle.open(first.root))
        assert loaded.source["weights"]["revision"] == cache["tiny_commit"]
        assert loaded.source["weights_sha256"] == first.manifest["source"]["weights_sha256"]
    finally:
        (repo_folder(cache["home"], TINY) / "refs" / "main").write_text(cache["tiny_commit"])


@pytest.mark.slow  # a CLI process or whole exports
def test_changed_cached_weights_are_refused_on_reload(cache, monkeypatch, tmp_path):
    """A bundle whose recorded file no longer has its sha256 (a damaged cache) is not checked against other weights."""
    from vitdeploy.bundle import Bundle
    from vitdeploy.exporters import loaded_for_bundle

    from hf_cache import copy_cache

    home = copy_cache(cache["home"], tmp_path / "home")
    offline_hub(monkeypatch, home)
    from vitdeploy.exporters import ExportOptions, export

    bundle = export(f"timm:hf-hub:{TINY}", tmp_path / "b", ExportOptions(check_images=2, simplify=False))
    blob = (repo_folder(home, TINY) / "snapshots" / cache["tiny_commit"] / "model.safetensors").resolve()
    other = repo_folder(home, TINY) / "snapshots" / cache["other_commit"] / "model.safetensors"
    blob.write_bytes(other.read_bytes())
    with pytest.raises(UserError) as err:
        loaded_for_bundle(Bundle.open(bundle.root))
    assert "is not the file the bundle was exported from" in str(err.value) and "\n" not in str(err.value)


def test_checkpoint_overrides_the_published_weights(cache, monkeypatch, tmp_path):
    from safetensors.torch import save_file

    from vitdeploy.exporters.sources import load_source

    offline_hub(monkeypatch, cache["home"])
    path = tmp_path / "ft.safetensors"
    save_file({k: v.contiguous() for k, v in cache["other"].state_dict().items()}, str(path))
    loaded = load_source(f"timm:hf-hub:{TINY}", checkpoint=path)
    assert loaded.source["weights"] == {"origin": "checkpoint", "file": str(path), "sha256": sha256_file(path)}
    assert loaded.source["random_init"] is False


def test_costs_of_a_timm_name_need_no_weights(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from vitdeploy.cli import main

    offline_hub(monkeypatch, tmp_path / "empty-home")  # nothing cached, no network: the architecture is enough
    result = CliRunner(env={"COLUMNS": "160"}).invoke(main, ["costs", "timm:vit_tiny_patch16_224", "--resolutions", "224"])
    assert result.exit_code == 0, result.output
    assert "224x224" in result.output


class _HubAnswers:
    """A local HTTP server that answers every request as the hub answers a gated repository, a
    missing one or an unknown revision (status + X-Error-Code, as huggingface_hub reads them)."""

    def __init__(self, status: int, error_code: str):
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                self.send_response(status)
                self.send_header("X-Error-Code", error_code)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(b'{"error": "refused by the test hub"}')

            do_GET = do_HEAD = _answer

            def log_message(self, *args):  # quiet
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("status, code, message", [
    (403, "GatedRepo", "is gated; accept its terms at"),
    (404, "RepoNotFound", "the hub has no repository test-org/absent (or it is private: set HF_TOKEN)"),
    (404, "RevisionNotFound", "has no revision 'v9'"),
])
def test_what_the_hub_answers_is_one_line(monkeypatch, tmp_path, status, code, message):
    """Gated without a token, missing (or private) and unknown revisions: named by the one probe, before any download."""
    from huggingface_hub import constants

    from vitdeploy.exporters.sources import load_source

    with _HubAnswers(status, code) as endpoint:
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "ENDPOINT", endpoint)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
        with pytest.raises(UserError) as err:
            load_source("timm:hf-hub:test-org/absent" + ("@v9" if code == "RevisionNotFound" else ""))
    text = str(err.value)
    assert message in text and "\n" not in text, text
    assert not (tmp_path / "hub").exists()  # nothing was downloaded or cached
