"""A Triton Inference Server model repository for a bundle.

    OUT/<model>/config.pbtxt     platform, uint8 image input, the graph's outputs (logits, probs, embedding
                                 [d], patch_grid [d, G_h, G_w]; -1 for a dynamic grid), batching, instances
    OUT/<model>/labels.txt       wired as the probs output's label_filename (Triton's classification);
                                 absent for a backbone graph without probs
    OUT/<model>/vitdeploy.json   where the model came from (bundle, graph hash, engine fingerprint)
    OUT/<model>/1/model.onnx     (onnxruntime backend)  or  1/model.plan  (tensorrt backend)

Input and output names, types and shapes are read from the artifact itself (the ONNX graph; for an
engine, its source graph and build profiles), never assumed, so the config matches what the server
loads. The model folder is built in a staging folder and swapped in whole.

A client asks for classification with ``class_count`` on the ``probs`` output and gets
"prob:index:label" strings back; raw uint8 HWC pixels go in, as for every vitdeploy graph.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import precisions
from .bundle import Bundle
from .contract import InputContract
from .errors import ConfigError, UserError
from .fileio import atomic_write_json, atomic_write_text, staged_directory

TRITON_BACKENDS = ("onnxruntime", "tensorrt")
_PLATFORM = {"onnxruntime": "onnxruntime_onnx", "tensorrt": "tensorrt_plan"}
_MODEL_FILE = {"onnxruntime": "model.onnx", "tensorrt": "model.plan"}
_TYPES = {"uint8": "TYPE_UINT8", "int8": "TYPE_INT8", "float32": "TYPE_FP32", "float16": "TYPE_FP16", "int64": "TYPE_INT64", "int32": "TYPE_INT32"}
_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
LABELS_FILE = "labels.txt"
CLASS_OUTPUT = "probs"
FEATURE_OUTPUTS = ("embedding", "patch_grid")


@dataclass(frozen=True)
class TritonOptions:
    backend: str = "onnxruntime"
    max_batch: int = 32
    dynamic_batching: bool = False
    queue_delay_us: int = 100
    instances: int = 1
    kind: str = "gpu"  # gpu | cpu
    name: str | None = None
    precision: str = "best"
    engine: str | None = None  # engines/<target> to serve (tensorrt); default: the only/best one


@dataclass(frozen=True)
class _Tensor:
    name: str
    dtype: str
    shape: tuple[Any, ...]  # per-axis int (fixed) or None (dynamic), batch axis included


def write_triton_repo(bundle: str | Path | Bundle, out: str | Path, options: TritonOptions = TritonOptions()) -> Path:
    """Write ``out/<model>/`` for ``bundle``; returns the model folder."""
    if not isinstance(bundle, Bundle):
        bundle = Bundle.open(bundle)
    opts = _validate(options)
    name = opts.name or _model_name(bundle.name)
    if opts.backend == "tensorrt":
        artifact, tensors, provenance = _tensorrt_artifact(bundle, opts)
    else:
        artifact, tensors, provenance = _onnx_artifact(bundle, opts)
    inputs, outputs = tensors
    config = render_config(name, opts, inputs, outputs, bundle.spec.num_classes, provenance, InputContract.from_bundle(bundle))
    labels = bundle.labels or [str(k) for k in range(bundle.spec.num_classes)]
    classifies = any(t.name == CLASS_OUTPUT for t in outputs)
    if classifies and len(labels) != bundle.spec.num_classes:
        raise ConfigError(f"bundle {bundle.root} has {len(labels)} labels for {bundle.spec.num_classes} classes; re-export it")
    model_dir = Path(out) / name
    check_repo_target(Path(out), model_dir, bundle)
    with staged_directory(model_dir) as stage:
        (stage / "1").mkdir()
        for src in artifact:
            target = stage / "1" / (_MODEL_FILE[opts.backend] if src is artifact[0] else src.name)
            shutil.copyfile(src, target)
        atomic_write_text(stage / "config.pbtxt", config)
        if classifies:
            atomic_write_text(stage / LABELS_FILE, "".join(f"{label}\n" for label in labels))
        atomic_write_json(stage / "vitdeploy.json", provenance)
    return model_dir


# -- where it writes ---------------------------------------------------------------------------
_OWN_FILES = frozenset({"config.pbtxt", LABELS_FILE, "vitdeploy.json"})  # and "1/", the version folder


def check_repo_target(out: Path, model_dir: Path, bundle: Bundle) -> None:
    """OUT/<model> is staged and swapped in whole, so refuse, in one line and before anything is written,
    an OUT that is a file or a bundle (its engines/ or reports/ could be named as the model), and a model
    folder holding anything a previous triton-repo did not write (another version folder, a hand-edited
    model, someone else's model of that name). A folder inside a bundle is a repository like any other."""
    from .bundle import FORMAT, MANIFEST

    if out.exists() and not out.is_dir():
        raise UserError(f"{out} is a file, not a folder; give the model repository's folder (nothing was written)")
    try:
        manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8")) if (out / MANIFEST).is_file() else None
    except (OSError, UnicodeDecodeError, ValueError):
        manifest = None
    if isinstance(manifest, dict) and manifest.get("format") == FORMAT:
        raise UserError(f"{out} is a vitdeploy bundle, not a model repository; write the repository to another folder (nothing was written)")
    if not model_dir.exists() and not model_dir.is_symlink():
        return
    if model_dir.is_symlink() or not model_dir.is_dir():
        raise UserError(f"{model_dir} exists and is not a folder vitdeploy wrote; choose another --name or OUT (nothing was written)")
    entries = sorted(model_dir.iterdir())
    if not entries:
        return
    foreign = [e.name for e in entries if not ((e.name in _OWN_FILES and e.is_file()) or (e.name == "1" and e.is_dir()))]
    version = model_dir / "1"
    if not foreign and version.is_dir():
        foreign = [f"1/{e.name}" for e in sorted(version.iterdir()) if not e.is_file()]
    if not foreign and not (model_dir / "vitdeploy.json").is_file():
        foreign = [entries[0].name]  # no provenance: not written by triton-repo
    if foreign:
        raise UserError(f"{model_dir} holds {foreign[0]}, which vitdeploy triton-repo did not write; the model folder is replaced "
                        "whole, so move it away, or choose another --name or OUT (nothing was written)")


# -- options -----------------------------------------------------------------------------------
def _validate(opts: TritonOptions) -> TritonOptions:
    if opts.backend not in TRITON_BACKENDS:
        raise UserError(f"backend must be one of {', '.join(TRITON_BACKENDS)}, got {opts.backend!r}")
    if opts.kind not in ("gpu", "cpu"):
        raise UserError(f"instance kind must be gpu or cpu, got {opts.kind!r}")
    if opts.backend == "tensorrt" and opts.kind == "cpu":
        raise UserError("a TensorRT engine runs on a GPU only; use --kind gpu, or --backend onnxruntime for CPU instances")
    if opts.max_batch < 0:
        raise UserError(f"--max-batch must be 0 (no batching) or positive, got {opts.max_batch}")
    if opts.dynamic_batching and opts.max_batch == 0:
        raise UserError("dynamic batching needs --max-batch > 0")
    if opts.instances < 1:
        raise UserError(f"--instances must be at least 1, got {opts.instances}")
    if opts.queue_delay_us < 0:
        raise UserError(f"queue delay must be >= 0 microseconds, got {opts.queue_delay_us}")
    if opts.name is not None and not _NAME_OK.match(opts.name):
        raise UserError(f"model name {opts.name!r} may hold only letters, digits, '_', '-' and '.', and must start with a letter or digit")
    return opts


def _model_name(raw: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", raw).strip("._-")
    return name or "vit"


def model_name(bundle: Bundle, options: TritonOptions = TritonOptions()) -> str:
    """The model name a repository (and `vitdeploy serve`) gives ``bundle``."""
    return _validate(options).name or _model_name(bundle.name)


def model_tensors(bundle: str | Path | Bundle, options: TritonOptions = TritonOptions()) -> tuple[list[_Tensor], list[_Tensor]]:
    """(inputs, outputs) exactly as ``write_triton_repo`` declares them in config.pbtxt: name, numpy
    dtype name, shape with the batch axis first (None where dynamic). `vitdeploy serve` binds these,
    so one client works against both servers and new graph outputs follow by themselves."""
    if not isinstance(bundle, Bundle):
        bundle = Bundle.open(bundle)
    opts = _validate(options)
    artifact = _tensorrt_artifact if opts.backend == "tensorrt" else _onnx_artifact
    _, tensors, _ = artifact(bundle, opts)
    return tensors


def triton_type(dtype: str) -> str:
    """Triton's data_type for a numpy dtype name (``uint8`` -> ``TYPE_UINT8``)."""
    if dtype not in _TYPES:
        raise UserError(f"type {dtype} has no Triton data_type in this repository writer")
    return _TYPES[dtype]


# -- artifacts ---------------------------------------------------------------------------------
def _graph_io(path: Path) -> tuple[list[_Tensor], list[_Tensor]]:
    from .engine.plan import read_graph_io

    ins, outs = read_graph_io(path)

    def conv(t: Any) -> _Tensor:
        return _Tensor(t.name, t.dtype, tuple(d if isinstance(d, int) and d > 0 else None for d in t.shape))

    return [conv(t) for t in ins], [conv(t) for t in outs]


def _external_data_files(path: Path) -> list[Path]:
    """Files a large ONNX graph keeps its weights in: they travel with model.onnx, under the name the
    graph gives them (so the copied graph is byte-identical to the bundle's and resolves them)."""
    from .onnx_io import referenced_files

    missing = [p.name for p in referenced_files(path) if not p.is_file()]
    if missing:
        raise UserError(f"{path} keeps its weights in {', '.join(missing)}, which is missing beside it; re-create the graph")
    return referenced_files(path)


def _onnx_artifact(bundle: Bundle, opts: TritonOptions) -> tuple[list[Path], tuple[list[_Tensor], list[_Tensor]], dict[str, Any]]:
    have = bundle.precisions()
    if opts.precision == "best":
        # Triton's ORT backend on a GPU gains from the fp16 graph; on CPU instances fp32 is faster and exact.
        precision = "fp16" if opts.kind == "gpu" and "fp16" in have else "fp32"
    else:
        precision = opts.precision
    path = bundle.artifact_path(precision)
    extra = _external_data_files(path)
    inputs, outputs = _graph_io(path)
    record = bundle.artifact_record(precision)
    provenance = {
        "bundle": str(bundle.root.resolve()),
        "name": bundle.name,
        "backend": "onnxruntime",
        "precision": precision,
        "graph_sha256": record.get("sha256"),
        **({"graph_data": record["data"]} if record.get("data") else {}),  # the external data file: name, sha256, bytes
        "preprocessing": bundle.preprocessing,
        "outputs": bundle.graph.output_details,  # what each output holds
    }
    return [path, *extra], (inputs, outputs), provenance


def _tensorrt_artifact(bundle: Bundle, opts: TritonOptions) -> tuple[list[Path], tuple[list[_Tensor], list[_Tensor]], dict[str, Any]]:
    from .runtime.engines import find_engines

    engines = find_engines(bundle)
    if not engines:
        raise UserError(
            f"bundle {bundle.root} has no TensorRT engine; build one on a GPU like the server's with "
            f"`vitdeploy build-engine {bundle.root}`, or use --backend onnxruntime"
        )
    if opts.engine:
        chosen = [e for e in engines if e.target == opts.engine]
        if not chosen:
            raise UserError(f"bundle {bundle.root} has no engine {opts.engine!r} (has: {', '.join(e.target for e in engines)})")
        engine = chosen[0]
    else:
        # One engine per GPU/TensorRT target is normal; which server it is for, only the user knows.
        wanted = precisions.BEST_ORDER if opts.precision == precisions.BEST else (opts.precision,)
        tier = next(([e for e in engines if e.precision == p] for p in wanted if any(e.precision == p for e in engines)), [])
        if not tier:
            raise UserError(f"bundle {bundle.root} has no {opts.precision} engine (has: {', '.join(e.target for e in engines)})")
        if len(tier) > 1:
            raise UserError(
                f"bundle {bundle.root} has several {tier[0].precision} engines ({', '.join(e.target for e in tier)}); "
                "choose the one built for the server's GPU and TensorRT with --engine TARGET"
            )
        engine = tier[0]
    if not engine.plan_path.is_file():
        raise UserError(f"engine {engine.target} lists {engine.plan_path} but the file is missing; rebuild it")
    source = bundle.artifact_path(engine.source_precision)
    inputs, outputs = _graph_io(source)
    # The plan's shapes are the graph's within its first profile: fixed axes where min == max.
    batch, height, width = engine.profile
    image = inputs[0]
    nchw = bundle.preprocessing.get("input", "uint8-nhwc") == "float-nchw"
    axes = ("N", "C", "H", "W") if nchw else ("N", "H", "W", "C")
    ranges = {"N": batch, "H": height, "W": width}
    dims = tuple(3 if a == "C" else (ranges[a][0] if ranges[a][0] == ranges[a][2] else None) for a in axes)
    # the per-image inputs beside the pixels (a variable-size engine's valid_hw [B, 2]) share the batch range
    batch_dim = batch[0] if batch[0] == batch[2] else None
    inputs = [_Tensor(image.name, image.dtype, dims)] + [_Tensor(t.name, t.dtype, (batch_dim, *t.shape[1:])) for t in inputs[1:]]
    if batch[0] > 1:
        raise UserError(f"engine {engine.target} needs batches of at least {batch[0]}; Triton sends single requests — rebuild with --batch 1:8:{batch[2]}")
    if opts.max_batch > batch[2]:
        raise UserError(
            f"--max-batch {opts.max_batch} exceeds engine {engine.target}'s profile (batch up to {batch[2]}); "
            f"pass --max-batch {batch[2]} or rebuild with --batch 1:8:{opts.max_batch}"
        )
    provenance = {
        "bundle": str(bundle.root.resolve()),
        "name": bundle.name,
        "backend": "tensorrt",
        "precision": engine.precision,
        "engine": engine.target,
        "graph_sha256": engine.record.get("source_sha256"),
        "fingerprint": engine.fingerprint,
        "preprocessing": bundle.preprocessing,
        "outputs": bundle.graph.output_details,  # what each output holds
    }
    return [engine.plan_path], (inputs, outputs), provenance


# -- config.pbtxt ------------------------------------------------------------------------------
def render_config(
    name: str,
    opts: TritonOptions,
    inputs: list[_Tensor],
    outputs: list[_Tensor],
    num_classes: int,
    provenance: dict[str, Any],
    contract: InputContract | None = None,
) -> str:
    """The ModelConfig in protobuf text format; the inputs must be the input contract's (default: one
    image input)."""
    expected = list(contract.input_names) if contract is not None else [inputs[0].name if inputs else "images"]
    if [t.name for t in inputs] != expected:
        raise UserError(f"the graph takes inputs ({', '.join(t.name for t in inputs)}); the bundle's manifest describes "
                        f"({', '.join(expected)}): re-export it with vitdeploy")
    variable = contract is not None and contract.mixes_sizes  # a --variable-size graph: canvas + valid sizes
    batched = opts.max_batch > 0
    for tensor in inputs + outputs:
        if tensor.dtype not in _TYPES:
            raise UserError(f"tensor {tensor.name!r} has type {tensor.dtype}, which this repository writer does not map to Triton")
        if batched and tensor.shape and tensor.shape[0] is not None:
            raise UserError(
                f"tensor {tensor.name!r} has a fixed batch of {tensor.shape[0]}; Triton batching needs a dynamic batch axis "
                "(re-export, or pass --max-batch 0)"
            )
    out_names = {t.name for t in outputs}
    # a classifier graph has probs (Triton's classification extension reads it); a backbone graph
    # exported with --outputs embedding,patch_grid serves its features as they are
    if CLASS_OUTPUT not in out_names and not out_names & set(FEATURE_OUTPUTS):
        raise UserError(f"the graph has no {CLASS_OUTPUT!r} output (outputs: {', '.join(sorted(out_names))}); re-export it with vitdeploy")

    def dims(tensor: _Tensor) -> str:
        shape = tensor.shape[1:] if batched else tensor.shape
        return "[ " + ", ".join(str(-1 if d is None else d) for d in shape) + " ]"

    lines = [f"# vitdeploy triton-repo: {provenance['name']} ({provenance['backend']}, {provenance['precision']})"]
    fp = provenance.get("fingerprint") or {}
    if fp:
        lines.append(
            "# engine built with TensorRT {trt} for {gpu} (compute capability {cc}): the server's TensorRT and GPU must match".format(
                trt=fp.get("tensorrt", "?"), gpu=fp.get("device", {}).get("gpu_name", "?"), cc=fp.get("device", {}).get("compute_capability", "?")
            )
        )
    lines.append("# input: raw uint8 pixels; preprocessing is inside the model (see vitdeploy.json)")
    if variable:
        lines.append("# variable size: each image top-left in the canvas, valid_hw = its (height, width) in whole patches")
    lines += [
        f'name: "{name}"',
        f'platform: "{_PLATFORM[opts.backend]}"',
        f'default_model_filename: "{_MODEL_FILE[opts.backend]}"',
        f"max_batch_size: {opts.max_batch}",
        "input [",
    ]
    for i, tensor in enumerate(inputs):
        lines.append(f'  {{ name: "{tensor.name}" data_type: {_TYPES[tensor.dtype]} dims: {dims(tensor)} }}' + ("," if i < len(inputs) - 1 else ""))
    lines.append("]")
    for tensor in outputs:  # what the feature outputs hold, for whoever reads the config
        detail = (provenance.get("outputs") or {}).get(tensor.name) or {}
        if tensor.name in FEATURE_OUTPUTS and detail:
            lines.append(f"# output {tensor.name}: {detail.get('meaning')}" + (f"; {detail['order'].split(';')[0]}" if detail.get("order") else ""))
    lines.append("output [")
    for i, tensor in enumerate(outputs):
        label = f' label_filename: "{LABELS_FILE}"' if tensor.name == CLASS_OUTPUT else ""
        lines.append(f'  {{ name: "{tensor.name}" data_type: {_TYPES[tensor.dtype]} dims: {dims(tensor)}{label} }}' + ("," if i < len(outputs) - 1 else ""))
    lines.append("]")
    if opts.dynamic_batching:
        lines.append(f"dynamic_batching {{ max_queue_delay_microseconds: {opts.queue_delay_us} }}")
    kind = "KIND_GPU" if opts.kind == "gpu" else "KIND_CPU"
    lines.append(f"instance_group [ {{ count: {opts.instances} kind: {kind} }} ]")
    return "\n".join(lines) + "\n"


def describe_repo(model_dir: Path) -> dict[str, Any]:
    """What was written (for the CLI's summary)."""
    files = sorted(str(p.relative_to(model_dir.parent)) for p in model_dir.rglob("*") if p.is_file())
    return {"model_dir": str(model_dir), "files": files, "provenance": json.loads((model_dir / "vitdeploy.json").read_text())}
