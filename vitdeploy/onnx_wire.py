"""The protobuf wire format of an ONNX model, written a piece at a time (used by :mod:`vitdeploy.onnx_io`).

``ModelProto.SerializeToString`` builds the whole message in one buffer (upb grows it, then copies
it into a Python bytes object: about four times the graph at once). A message is only its fields in
field-number order, each embedded message a tag, a varint length and its bytes, so a model can be
written as: the model's fields before ``graph`` (field 7), the graph's tag and length, the graph's
fields before ``initializer`` (field 5), each initializer serialised on its own, the graph's remaining
fields, the model's remaining fields - byte-identical to ``SerializeToString`` (tested), with one
tensor in memory at a time. A tensor that goes to the data file is written there and replaced in the
graph by a stub: its name, type and dims, ``data_location = EXTERNAL`` and ``location``/``offset``/
``length`` (onnx.proto, ``TensorProto.external_data``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, BinaryIO

from .errors import InternalError, UserError

MIN_EXTERNAL_TENSOR_BYTES = 1024  # onnx.save's own default: shape constants and scalars stay inline
ALIGN_BYTES = 4096  # large tensors start on a page, so a runtime can map them in place
ALIGN_FROM_BYTES = 1 << 20
DATA_FIELDS = {"raw_data", "float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data",
               "external_data", "data_location"}


def _onnx() -> Any:
    from .lazy import require

    return require("onnx", "reading and writing ONNX graphs")


def external_info(tensor: Any) -> dict[str, str]:
    return {entry.key: entry.value for entry in tensor.external_data}


def is_external(tensor: Any) -> bool:
    return tensor.data_location == _onnx().TensorProto.EXTERNAL


def tensor_bytes(tensor: Any) -> int:
    """Bytes of a TensorProto's data, wherever it is kept (raw, typed fields or external)."""
    onnx = _onnx()
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return int(external_info(tensor).get("length", 0))
    if tensor.HasField("raw_data"):
        return len(tensor.raw_data)
    count = 1
    for d in tensor.dims:
        count *= int(d)
    return count * _element_size(onnx, tensor.data_type)


def _element_size(onnx: Any, data_type: int) -> int:
    try:
        return int(onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize)
    except Exception:  # strings and unknown types: no fixed size, never external here
        return 0


def set_field(target: Any, field: Any, value: Any) -> None:
    repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == field.LABEL_REPEATED
    if repeated:
        getattr(target, field.name).extend(value)
    elif field.message_type is not None:
        getattr(target, field.name).CopyFrom(value)
    else:
        setattr(target, field.name, value)


def stub(onnx: Any, tensor: Any, location: str, offset: int, length: int) -> Any:
    """``tensor`` without its data, pointing at ``location`` [offset, offset + length)."""
    stub = onnx.TensorProto()
    for field, value in tensor.ListFields():
        if field.name not in DATA_FIELDS:
            set_field(stub, field, value)
    stub.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = stub.external_data.add()
        entry.key, entry.value = key, value
    return stub


DATA_FIELDS = {"raw_data", "float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data",
                "external_data", "data_location"}


# -- the wire format, piece by piece ------------------------------------------------------------
# ModelProto.graph is field 7 and GraphProto.initializer field 5 (onnx.proto); protobuf writes the
# fields of a message in field-number order, each embedded message as tag + varint length + bytes.
_GRAPH_FIELD, _INITIALIZER_FIELD = 7, 5


def plan(model: Any, external: bool) -> list[tuple[Any, str, int]]:
    """Per initializer: (tensor, how, bytes): "inline", "raw" (its data moves to the data file) or
    "copy" (already external: copied from its source file)."""
    plan = []
    for tensor in model.graph.initializer:
        size = tensor_bytes(tensor)
        if is_external(tensor):
            plan.append((tensor, "copy" if external else "load", size))
        elif external and size >= MIN_EXTERNAL_TENSOR_BYTES and tensor.data_type != _onnx().TensorProto.STRING:
            plan.append((tensor, "raw", size))
        else:
            plan.append((tensor, "inline", size))
    return plan


def write_model(model: Any, plan: list[tuple[Any, str, int]], location: str, graph_out: "Hashing", data_out: "Hashing",
                 sources: "Sources") -> None:
    onnx = _onnx()
    head, tail = _split(model, _GRAPH_FIELD, onnx.ModelProto)
    graph_head, graph_tail = _split(model.graph, _INITIALIZER_FIELD, onnx.GraphProto)
    # tensor, how, offset and length in the data file, size of its serialised entry in the graph
    pieces: list[tuple[Any, str, int, int, int]] = []
    offset = 0
    for tensor, how, size in plan:
        if how == "copy":
            size = sources.length(tensor)
        if how in ("raw", "copy"):
            if size >= ALIGN_FROM_BYTES and offset % ALIGN_BYTES:
                offset += ALIGN_BYTES - offset % ALIGN_BYTES
            entry = stub(onnx, tensor, location, offset, size).ByteSize()
            pieces.append((tensor, how, offset, size, entry))
            offset += size
        elif how == "load":  # external in the source, inline in the result: load it on its own
            tensor = sources.loaded(tensor)
            pieces.append((tensor, "inline", 0, 0, tensor.ByteSize()))
        else:
            pieces.append((tensor, how, 0, 0, tensor.ByteSize()))
    graph_head_bytes, graph_tail_bytes = graph_head.SerializeToString(), graph_tail.SerializeToString()
    graph_size = len(graph_head_bytes) + len(graph_tail_bytes) + sum(_len_prefixed(n) for *_, n in pieces)
    graph_out.write(head.SerializeToString())
    if model.HasField("graph"):
        graph_out.write(_tag(_GRAPH_FIELD) + _varint(graph_size))
        graph_out.write(graph_head_bytes)
        for tensor, how, at, length, size in pieces:
            if how == "inline":
                data = tensor.SerializeToString()
            else:
                data_out.pad_to(at)
                if how == "raw":
                    data_out.write(_raw_bytes(onnx, tensor))
                else:
                    sources.copy_to(tensor, data_out)
                data = stub(onnx, tensor, location, at, length).SerializeToString()
            if len(data) != size:
                raise InternalError(f"save: tensor {tensor.name} serialised to {len(data)} bytes, planned {size}")
            graph_out.write(_tag(_INITIALIZER_FIELD) + _varint(len(data)))
            graph_out.write(data)
        graph_out.write(graph_tail_bytes)
    graph_out.write(tail.SerializeToString())


def _split(message: Any, number: int, cls: Any) -> tuple[Any, Any]:
    """Two messages holding ``message``'s fields below and above field ``number``."""
    before, after = cls(), cls()
    for field, value in message.ListFields():
        if field.number != number:
            set_field(before if field.number < number else after, field, value)
    return before, after


def _raw_bytes(onnx: Any, tensor: Any) -> bytes:
    if tensor.HasField("raw_data"):
        return tensor.raw_data
    import numpy as np

    array = onnx.numpy_helper.to_array(tensor)
    return np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tobytes()


def _tag(number: int) -> bytes:
    return _varint(number << 3 | 2)  # wire type 2: length-delimited


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _len_prefixed(size: int) -> int:
    return len(_tag(_INITIALIZER_FIELD)) + len(_varint(size)) + size


class Hashing:
    """A file being written and the sha256 of what was written to it."""

    def __init__(self, fh: BinaryIO, digest: Any):
        self.fh, self.digest, self.size = fh, digest, 0

    def write(self, data: bytes) -> None:
        self.fh.write(data)
        self.digest.update(data)
        self.size += len(data)

    def pad_to(self, offset: int) -> None:
        if offset > self.size:
            self.write(b"\0" * (offset - self.size))


class Sources:
    """Open data files of a model loaded with ``weights=False``, read one tensor at a time."""

    CHUNK = 16 << 20

    def __init__(self, root: str | os.PathLike | None):
        self.root = Path(root) if root is not None else None
        self.files: dict[str, BinaryIO] = {}

    def __enter__(self) -> "Sources":
        return self

    def __exit__(self, *exc: Any) -> None:
        for fh in self.files.values():
            fh.close()

    def _span(self, tensor: Any) -> tuple[BinaryIO, int, int]:
        if self.root is None:
            raise InternalError(f"save: tensor {tensor.name} is on disk and no source_dir was given")
        info = external_info(tensor)
        name = info["location"]
        if name not in self.files:
            try:
                self.files[name] = open(self.root / name, "rb")
            except OSError as exc:
                raise UserError(f"cannot read {self.root / name} (the weights of the graph being written): {exc.strerror}") from None
        fh, offset = self.files[name], int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else os.fstat(fh.fileno()).st_size - offset
        return fh, offset, length

    def length(self, tensor: Any) -> int:
        return self._span(tensor)[2]

    def copy_to(self, tensor: Any, out: Hashing) -> None:
        fh, offset, length = self._span(tensor)
        fh.seek(offset)
        while length > 0:
            block = fh.read(min(self.CHUNK, length))
            if not block:
                raise UserError(f"{fh.name} is shorter than its graph says (tensor {tensor.name}); re-create the graph")
            out.write(block)
            length -= len(block)

    def loaded(self, tensor: Any) -> Any:
        onnx = _onnx()
        fh, offset, length = self._span(tensor)
        fh.seek(offset)
        full = onnx.TensorProto()
        for field, value in tensor.ListFields():
            if field.name not in DATA_FIELDS:
                set_field(full, field, value)
        full.raw_data = fh.read(length)
        return full


