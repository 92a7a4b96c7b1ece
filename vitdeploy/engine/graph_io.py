"""The graph's inputs as an engine build sees them: names, dtypes, shapes (symbolic axes named), and
which one is the image (its layout: NHWC uint8 or NCHW float), read without loading the weights."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import UserError


@dataclass(frozen=True)
class GraphTensor:
    name: str
    dtype: str  # numpy name: uint8, float32, float16, ...
    shape: tuple[int | str, ...]  # ints for fixed axes, symbol names for dynamic ones


def read_graph_io(path: str | Path) -> tuple[list[GraphTensor], list[GraphTensor]]:
    """The ONNX graph's real inputs and outputs (initializers excluded), without loading weights."""
    from ..lazy import require

    onnx = require("onnx", "reading the graph's inputs")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # DecodeError, OSError ...
        raise UserError(f"{path} is not a readable ONNX file ({exc.__class__.__name__})") from None
    inits = {i.name for i in model.graph.initializer}

    def describe(value: Any) -> GraphTensor:
        ttype = value.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(ttype.elem_type).name if ttype.elem_type else "unknown"
        dims: list[int | str] = []
        for d in ttype.shape.dim:
            if d.HasField("dim_value") and d.dim_value > 0:
                dims.append(int(d.dim_value))
            else:
                dims.append(d.dim_param or "?")
        return GraphTensor(value.name, dtype, tuple(dims))

    inputs = [describe(v) for v in model.graph.input if v.name not in inits]
    outputs = [describe(v) for v in model.graph.output]
    return inputs, outputs


@dataclass(frozen=True)
class InputLayout:
    """Where batch, height, width and channels sit in the graph's image input."""

    name: str
    dtype: str
    layout: str  # "NHWC" (vitdeploy's uint8 contract) or "NCHW" (float-nchw graphs)
    channels: int
    fixed: dict[str, int]  # axis letter -> fixed size, for the axes the graph does not leave dynamic

    def shape(self, batch: int, height: int, width: int) -> tuple[int, int, int, int]:
        if self.layout == "NHWC":
            return (batch, height, width, self.channels)
        return (batch, self.channels, height, width)


def image_input(inputs: list[GraphTensor], channels: int = 3) -> InputLayout:
    if len(inputs) != 1:
        names = ", ".join(i.name for i in inputs) or "none"
        raise UserError(f"the graph has {len(inputs)} inputs ({names}); vitdeploy engines take one image input")
    return _image_layout(inputs[0], channels)


def _image_layout(tensor: GraphTensor, channels: int) -> InputLayout:
    if len(tensor.shape) != 4:
        raise UserError(f"input {tensor.name!r} has shape {list(tensor.shape)}; expected 4-D images (N,H,W,C or N,C,H,W)")
    if tensor.shape[3] == channels:
        layout, axes = "NHWC", "NHWC"
    elif tensor.shape[1] == channels:
        layout, axes = "NCHW", "NCHW"
    else:
        raise UserError(f"input {tensor.name!r} has shape {list(tensor.shape)}: no axis of {channels} channels")
    fixed = {axis: int(dim) for axis, dim in zip(axes, tensor.shape) if isinstance(dim, int) and axis != "C"}
    return InputLayout(tensor.name, tensor.dtype, layout, channels, fixed)


@dataclass(frozen=True)
class BatchedInput:
    """A per-image input beside the images: [batch, *dims] with fixed ``dims`` and the images' batch
    axis (a variable-size bundle's ``valid_hw`` int32 [B, 2]). Its profile shapes follow the batch
    range of each profile, so one set of --batch options shapes every input."""

    name: str
    dtype: str
    dims: tuple[int, ...]

    def shape(self, batch: int) -> tuple[int, ...]:
        return (int(batch),) + tuple(int(d) for d in self.dims)


def graph_inputs(inputs: list[GraphTensor], channels: int = 3, image_name: str = "images") -> tuple[InputLayout, tuple[BatchedInput, ...]]:
    """The image input and the per-image inputs beside it.

    One input: it is the image input (the single-input contract, as before). Several: the one named
    ``image_name`` (else the only 4-D input with a ``channels`` axis) holds the images, and every
    other input must be [batch, fixed dims...] sharing the images' batch axis, which is what an
    optimisation profile can shape from the batch range alone.
    """
    if len(inputs) <= 1:
        return image_input(inputs, channels), ()
    named = [t for t in inputs if t.name == image_name]
    if not named:
        named = [t for t in inputs if len(t.shape) == 4 and channels in (t.shape[1], t.shape[3])]
    if len(named) != 1:
        names = ", ".join(f"{t.name} {list(t.shape)}" for t in inputs)
        raise UserError(f"the graph has {len(inputs)} inputs ({names}) and no single image input {image_name!r}; "
                        "vitdeploy engines take one image input plus per-image inputs [batch, ...]")
    layout = _image_layout(named[0], channels)
    batch_dim = named[0].shape[0]
    extras = []
    for tensor in inputs:
        if tensor.name == layout.name:
            continue
        rest = tensor.shape[1:]
        if not tensor.shape or tensor.shape[0] != batch_dim or not all(isinstance(d, int) for d in rest):
            raise UserError(
                f"graph input {tensor.name!r} has shape {list(tensor.shape)}; beside the images {list(named[0].shape)} an engine "
                f"takes per-image inputs [{batch_dim}, fixed dims...] that share the images' batch axis"
            )
        extras.append(BatchedInput(tensor.name, tensor.dtype, tuple(int(d) for d in rest)))  # type: ignore[arg-type]
    return layout, tuple(extras)


