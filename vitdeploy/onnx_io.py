"""ONNX graphs on disk: one graph file, and for large graphs one external data file beside it.

Every pass that writes a graph (export, onnxslim, fp16, int8, the 8.x lowering, the fused CPU graph)
saves it through :func:`save`, and every reader that needs more than the graph's structure goes
through :func:`load`; both follow one rule:

* **Which graphs keep their weights outside.** A graph whose initializers hold more than the
  threshold (``--external-data-threshold`` on export, recorded in the manifest for the bundle's later
  passes; else ``VITDEPLOY_EXTERNAL_DATA_THRESHOLD``; else 1 GiB; ``0`` = always) is written with its
  tensors of ``MIN_EXTERNAL_TENSOR_BYTES`` or more in one data file beside it. Protobuf cannot
  serialise a message over 2 GiB, so a graph whose weights come near that is always written so.
* **The name.** ``<graph file>.data``: ``model.onnx`` -> ``model.onnx.data``, the rule the dynamo
  exporter and ONNX Runtime's quantizer follow (``Path(output).name + ".data"``). ONNX stores the
  location relative to the graph, so the pair is copied together and resolves anywhere (TensorRT
  ``parse_from_file``, ONNX Runtime and Triton sessions made from the path).
* **Both files atomically.** Graph and data are written to hidden temporary files in the destination
  folder, fsynced and renamed in one step that a Ctrl-C or SIGTERM cannot split, the old graph moved
  aside first (:func:`_commit`): no graph ever names a data file written for another graph.
* **Memory that stays at one copy of the weights.** ``ModelProto.SerializeToString`` needs about four
  times the graph while it runs (measured here: +1.34 GB for a 330 MB ViT-B/16 graph; upb grows its
  buffer and then copies it), and ``onnx.load`` of a single file twice (the bytes, then the parsed
  message). :func:`save` writes the protobuf wire format piece by piece instead (:mod:`.onnx_wire`:
  the model's fields, then each initializer serialised on its own), so at most one tensor is
  serialised at a time; the single-file result is byte-identical to ``SerializeToString`` (tested),
  so graph hashes do not change. External data is written tensor by tensor, hashed as it is written.
  Passes that rewrite only nodes load the structure (``load(weights=False)``) and stream the weights
  from the source's data file into the new one (``save(source_dir=...)``).
* **Hashes.** :func:`save` returns the record the manifest stores: the graph's file, sha256 and size,
  and under ``data`` the same for the data file; :func:`check_files` compares both with a record.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator

from .errors import InternalError, UserError
from .records import STORAGE_THRESHOLD, storage_of
from .fileio import hidden_dir, signals_deferred, temp_file
from .storage import disk_errors, require_space
from .onnx_wire import (MIN_EXTERNAL_TENSOR_BYTES, Hashing, Sources, external_info, is_external, plan, set_field, stub, tensor_bytes,
                        write_model)

DATA_SUFFIX = ".data"
THRESHOLD_ENV = "VITDEPLOY_EXTERNAL_DATA_THRESHOLD"
DEFAULT_THRESHOLD_BYTES = 1 << 30  # 1 GiB of weights: ViT-L/16 fp32 (1.22 GB) and larger go external
# Protobuf's hard limit is 2 GiB for the whole message; weights past this always go external so the
# nodes, names and metadata have room.
INLINE_LIMIT_BYTES = (2 << 30) - (256 << 20)
MANIFEST_KEY = STORAGE_THRESHOLD  # the bundle's rule for later passes (vitdeploy.records.StorageRecord)

_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1000, "kib": 1024, "m": 1 << 20, "mb": 10**6, "mib": 1 << 20,
          "g": 1 << 30, "gb": 10**9, "gib": 1 << 30}


def _onnx() -> Any:
    from .lazy import require

    return require("onnx", "reading and writing ONNX graphs")


# -- the rule ---------------------------------------------------------------------------------
def data_file(graph: str | os.PathLike) -> Path:
    """The external data file of ``graph``: ``model.onnx`` -> ``model.onnx.data``."""
    graph = Path(graph)
    return graph.with_name(graph.name + DATA_SUFFIX)


def parse_size(text: str | int, what: str = "--external-data-threshold") -> int:
    """``0``, ``1GiB``, ``512MB``, ``1.5G``, ``2000000000`` -> bytes (K/M/G without B are binary)."""
    if isinstance(text, int):
        value, unit = float(text), ""
    else:
        raw = str(text).strip().lower().replace(" ", "")
        number = raw.rstrip("abcdefghijklmnopqrstuvwxyz")
        value, unit = (float(number) if number else -1.0), raw[len(number):]
    if value < 0 or unit not in _UNITS:
        raise UserError(f"{what} {text!r}: expected a size such as 0, 512MiB, 1GiB or 1.5GB (0: always external data)")
    return int(value * _UNITS[unit])


def threshold(explicit: int | None = None, manifest: dict[str, Any] | None = None) -> int:
    """The weight size above which a graph is written with external data: the explicit value, else
    the bundle's recorded rule (an export's ``--external-data-threshold``: a choice for that bundle),
    else ``VITDEPLOY_EXTERNAL_DATA_THRESHOLD`` (the default of this environment), else 1 GiB."""
    if explicit is not None:
        return int(explicit)
    recorded = storage_of(manifest).external_data_threshold
    if recorded is not None:
        return int(recorded)
    env = os.environ.get(THRESHOLD_ENV, "").strip()
    return parse_size(env, THRESHOLD_ENV) if env else DEFAULT_THRESHOLD_BYTES


def weight_bytes(model: Any) -> int:
    """Bytes of every initializer of ``model`` (what external data would move out of the graph)."""
    return sum(tensor_bytes(t) for t in model.graph.initializer)


# -- reading ------------------------------------------------------------------------------------
def referenced_files(path: str | os.PathLike) -> list[Path]:
    """The data files ``path`` keeps its weights in (none for a single-file graph)."""
    path = Path(path)
    model = load(path, weights=False)
    names = sorted({external_info(t)["location"] for t in _all_tensors(model) if is_external(t)})
    return [path.parent / name for name in names]


def graph_files(path: str | os.PathLike) -> list[Path]:
    """The graph and every file it needs beside it: what a copy of the graph must carry."""
    return [Path(path), *referenced_files(path)]


def load(path: str | os.PathLike, weights: bool = True) -> Any:
    """``onnx.load`` with one-line errors; ``weights=False`` leaves external tensors on disk (their
    dims and types are there: enough for graph walks, shape inference and the I/O signature)."""
    onnx = _onnx()
    path = Path(path)
    if not path.is_file():
        raise UserError(f"ONNX file {path} does not exist")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError and friends
        raise UserError(f"{path} is not a readable ONNX file ({exc.__class__.__name__})") from None
    if weights:
        missing = [name for name in sorted({external_info(t).get("location", "") for t in _all_tensors(model) if is_external(t)})
                   if not (path.parent / name).is_file()]
        if missing:
            raise UserError(f"{path} keeps its weights in {', '.join(missing)}, which is missing beside it; "
                            f"copy it together with {path.name} (or re-create the graph)")
        try:
            onnx.external_data_helper.load_external_data_for_model(model, str(path.parent))
        except Exception as exc:
            raise UserError(f"cannot read the external data of {path}: {exc}") from None
    return model


def _all_tensors(model: Any) -> Iterator[Any]:
    """Initializers and tensor attributes of the main graph (vitdeploy graphs have no subgraphs)."""
    yield from model.graph.initializer
    for node in model.graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t


# -- writing ------------------------------------------------------------------------------------
def save(model: Any, path: str | os.PathLike, threshold_bytes: int | None = None, source_dir: str | os.PathLike | None = None,
         manifest: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write ``model`` to ``path`` (and ``<path>.data`` when its weights exceed the threshold),
    atomically; ``model`` is not modified. Returns ``{file, sha256, bytes[, data: {file, sha256, bytes}]}``.

    ``source_dir``: where the data of tensors that are still external in ``model`` (loaded with
    ``weights=False``) is read from; they are copied into the new data file without loading them all.
    """
    path = Path(path)
    limit = threshold(threshold_bytes, manifest)
    weights = weight_bytes(model)
    external = weights > limit or weights > INLINE_LIMIT_BYTES
    pieces = plan(model, external)
    if any(entry[1] == "copy" for entry in pieces) and source_dir is None:
        raise InternalError("save: the model has tensors on disk (loaded with weights=False) and no source_dir to read them from")
    data_target = data_file(path)
    # what the write needs: the weights, copied or moved, and the graph's structure (without them)
    needed = sum(size for _, _, size in pieces) + structure_copy(model).ByteSize()
    require_space(path.parent, needed, path.name)
    with _temp_beside(path) as graph_tmp, _temp_beside(data_target) as data_tmp, disk_errors(path.parent, needed, path.name):
        graph_digest, data_digest = hashlib.sha256(), hashlib.sha256()
        with open(graph_tmp, "wb") as graph_fh, open(data_tmp, "wb") as data_fh, Sources(source_dir) as sources:
            write_model(model, pieces, data_target.name, Hashing(graph_fh, graph_digest), Hashing(data_fh, data_digest), sources)
            for fh in (graph_fh, data_fh):
                fh.flush()
                os.fsync(fh.fileno())
        data_size = data_tmp.stat().st_size
        record: dict[str, Any] = {"file": path.name, "sha256": graph_digest.hexdigest(), "bytes": graph_tmp.stat().st_size}
        if external:
            record["data"] = {"file": data_target.name, "sha256": data_digest.hexdigest(), "bytes": data_size}
        _commit(graph_tmp, path, data_tmp if external else None, data_target)
    return record


@contextlib.contextmanager
def staged(target: str | os.PathLike, then: Callable[[], None] | None = None) -> Iterator[Path]:
    """A path named like ``target`` in a hidden folder beside it: write (and check) a graph there; when
    the block ends without an error the graph and its data file replace ``target``'s in one step
    (the data file's name is the graph's, so the graph needs no rewriting to move). ``then`` (e.g.
    recording the graph in the bundle's manifest) runs in the same signal-free step, so an interruption
    never leaves a new graph beside a manifest that vouches for the old one."""
    target = Path(target)
    with hidden_dir(target.parent, target.name, "staged") as folder:  # a killed writer's is removed first
        path = folder / target.name
        yield path
        if not path.is_file():
            raise InternalError(f"staged: nothing was written at {path}")
        data = data_file(path)
        with signals_deferred():
            _commit(path, target, data if data.is_file() else None, data_file(target))
            if then is not None:
                then()


def ensure_room(src: str | os.PathLike, dst: str | os.PathLike, fraction: float = 1.0) -> None:
    """Before a pass that derives graph ``dst`` from graph ``src`` starts (minutes of work on a large
    model), refuse in one line a folder that cannot take it: not writable, or without about ``fraction``
    of ``src``'s bytes (fp16: half; int8: a quarter, plus ORT's copy of the graph) and the disk reserve."""
    from .fileio import ensure_writable_dir

    dst = Path(dst)
    needed = int(fraction * sum(f.stat().st_size for f in graph_files(src)))
    ensure_writable_dir(dst.parent, needed, dst.name)


def copy(src: str | os.PathLike, dst: str | os.PathLike) -> dict[str, Any]:
    """Copy a graph and its data file to ``dst`` atomically; returns the record of the copy.

    Under the same file name the bytes are copied as they are; under another name the graph is
    re-written around its data (streamed from the source, never loaded whole) so its data file is
    named after ``dst``, as the rule says.
    """
    src, dst = Path(src), Path(dst)
    data = referenced_files(src)
    if data and (len(data) > 1 or data[0].name != data_file(src).name or dst.name != src.name):
        return save(load(src, weights=False), dst, threshold_bytes=0, source_dir=src.parent)
    data_target = data_file(dst)
    needed = src.stat().st_size + sum(f.stat().st_size for f in data)
    require_space(dst.parent, needed, dst.name)
    with _temp_beside(dst) as graph_tmp, _temp_beside(data_target) as data_tmp, disk_errors(dst.parent, needed, dst.name):
        shutil.copyfile(src, graph_tmp)
        if data:
            shutil.copyfile(data[0], data_tmp)
        for tmp in (graph_tmp, data_tmp):
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        _commit(graph_tmp, dst, data_tmp if data else None, data_target)
    return file_record(dst)


def remove(path: str | os.PathLike) -> None:
    """Delete a graph and the data file the rule names for it (a missing one is not an error)."""
    for target in (Path(path), data_file(path)):
        with contextlib.suppress(FileNotFoundError):
            target.unlink()


def file_record(path: str | os.PathLike) -> dict[str, Any]:
    """The manifest record of a graph already on disk (hashes read from the files)."""
    from .fileio import sha256_file

    path = Path(path)
    record: dict[str, Any] = {"file": path.name, "sha256": sha256_file(path), "bytes": path.stat().st_size}
    if path.suffix == ".onnx":
        data = referenced_files(path)
        if data:
            record["data"] = {"file": data[0].name, "sha256": sha256_file(data[0]), "bytes": data[0].stat().st_size}
    return record


def check_files(root: str | os.PathLike, record: dict[str, Any], hashes: bool = True) -> list[str]:
    """What does not match ``record`` (graph and data file: present, size, and with ``hashes`` sha256)."""
    from .fileio import sha256_file

    problems = []
    entries = [record] + ([record["data"]] if record.get("data") else [])
    for entry in entries:
        path = Path(root) / entry["file"]
        if not path.is_file():
            problems.append(f"{entry['file']} is missing")
        elif entry.get("bytes") is not None and path.stat().st_size != entry["bytes"]:
            problems.append(f"{entry['file']} has {path.stat().st_size} bytes, the manifest records {entry['bytes']}")
        elif hashes and entry.get("sha256") and sha256_file(path) != entry["sha256"]:
            problems.append(f"{entry['file']} does not match the manifest's sha256")
    return problems


# -- analysis without serialising the weights ----------------------------------------------------
def infer_shapes(model: Any, in_place: bool = False, **kwargs: Any) -> Any:
    """``onnx.shape_inference.infer_shapes`` on a copy whose large tensors are stubs on disk: the
    weights are never serialised (onnx serialises the model to call its C++ inference, which fails
    over 2 GiB and costs four times the graph's memory). Returns the inferred copy (types, shapes,
    value_info; its large initializers carry no data), or with ``in_place`` copies the inferred
    value_info and output types into ``model`` and returns it."""
    onnx = _onnx()
    inferred = onnx.shape_inference.infer_shapes(structure_copy(model), **kwargs)
    if not in_place:
        return inferred
    del model.graph.value_info[:]
    model.graph.value_info.extend(inferred.graph.value_info)
    for mine, theirs in zip(model.graph.output, inferred.graph.output):
        mine.type.CopyFrom(theirs.type)
    return model


def check_model(model: Any, full_check: bool = True) -> None:
    """``onnx.checker.check_model`` on the graph's structure: every tensor kept (or big enough to be
    kept) in a data file is given to the checker as a typed graph input instead, so the check never
    serialises the weights, works past 2 GiB and needs no data file where the model came from."""
    onnx = _onnx()
    copy_ = structure_copy(model)
    weights = [t for t in copy_.graph.initializer if is_external(t)]
    keep = [t for t in copy_.graph.initializer if not is_external(t)]
    del copy_.graph.initializer[:]
    copy_.graph.initializer.extend(keep)
    declared = {v.name for v in copy_.graph.input}
    for tensor in weights:
        if tensor.name not in declared:
            copy_.graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    onnx.checker.check_model(copy_, full_check=full_check)


def inline_arrays(model: Any) -> dict[str, Any]:
    """Initializers and Constant outputs whose data is in the graph, as numpy arrays (tensors still on
    disk - a graph loaded with ``weights=False`` - are left out: passes that read constants need
    axes, scales and shapes, which are small and inline, not the weights)."""
    numpy_helper = _onnx().numpy_helper
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if not is_external(t)}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output:
            for attr in node.attribute:
                if attr.name == "value" and not is_external(attr.t):
                    values[node.output[0]] = numpy_helper.to_array(attr.t)
    return values


def structure_copy(model: Any) -> Any:
    """A copy of ``model`` whose tensors of ``MIN_EXTERNAL_TENSOR_BYTES`` or more are stubs (name,
    type, dims; data "on disk" at a location that does not exist): for graph analysis only."""
    onnx = _onnx()
    copy_ = onnx.ModelProto()
    for field, value in model.ListFields():
        if field.name != "graph":
            set_field(copy_, field, value)
    for field, value in model.graph.ListFields():
        if field.name != "initializer":
            set_field(copy_.graph, field, value)
    for tensor in model.graph.initializer:
        if tensor_bytes(tensor) >= MIN_EXTERNAL_TENSOR_BYTES and not is_external(tensor):
            copy_.graph.initializer.append(stub(onnx, tensor, "vitdeploy-structure-only", 0, tensor_bytes(tensor)))
        else:
            copy_.graph.initializer.append(tensor)
    return copy_


# -- atomic files -------------------------------------------------------------------------------
def _temp_beside(target: Path) -> Any:
    """A hidden temporary file next to ``target`` (same file system), removed unless renamed."""
    return temp_file(target)


def _commit(graph_tmp: Path, graph: Path, data_tmp: Path | None, data: Path) -> None:
    """Rename the new data file and graph into place as one step (signals held until both are in).

    The old graph is first moved aside, so at no moment does a graph name a data file written for
    another graph: an interruption (power loss) leaves the old pair, no graph, or the new pair.
    """
    with signals_deferred():
        aside = None
        if data_tmp is not None and graph.exists():
            aside = graph.with_name(f".{graph.name}.old.{os.getpid()}")
            os.replace(graph, aside)
        if data_tmp is not None:
            os.replace(data_tmp, data)
        os.replace(graph_tmp, graph)
        if aside is not None:
            aside.unlink()
        if data_tmp is None:  # a single-file graph now: the old one's data file is stale
            with contextlib.suppress(FileNotFoundError):
                data.unlink()


__all__ = ["DATA_SUFFIX", "DEFAULT_THRESHOLD_BYTES", "THRESHOLD_ENV", "check_files", "copy", "data_file", "ensure_room", "file_record",
           "graph_files", "infer_shapes", "load", "parse_size", "referenced_files", "remove", "save", "structure_copy",
           "threshold", "tensor_bytes", "weight_bytes"]
