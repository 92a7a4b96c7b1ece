"""What each TensorRT's ONNX parser accepts, as data (no TensorRT import).

Every fact here was read from NVIDIA's ONNX parser sources (github.com/onnx/onnx-tensorrt, and the
``parsers/onnx`` submodule commit of each NVIDIA/TensorRT ``release/*`` branch), not observed by
running a parser: no TensorRT runs on the machines that wrote this. The base sets:

- ``8.5``: branch ``8.5-GA`` (JetPack 5.1.x): ``docs/operators.md`` (opset <= 17), the importer list
  of ``builtin_op_importers.cpp`` (``DEFINE_BUILTIN_OP_IMPORTER``), ``ModelImporter.cpp`` (ops without
  an importer fall to ``FallbackPluginImporter``; no ONNX function expansion), ``onnx2trt_utils.cpp``.
- ``8.6``: branch ``8.6-GA`` (JetPack 6.0), same files: adds ``LayerNormalization``,
  ``GroupNormalization``, ``IsInf`` and the "UINT8 only as network input/output" check.
- ``10.1``: branch ``10.1-GA`` (the newest 10.x release *branch* of onnx-tensorrt): opset 9-20, adds
  ``Gelu``, ``CastLike``, ``Mish``, ``Hardmax``, ``DeformConv``, ``LocalFunctionImporter``.

Every later 10.x/11.x version is that base plus the changes ``_CHANGES`` lists, each with the
version it arrived in and where that was read: onnx-tensorrt ``docs/Changelog.md`` (the copy whose
newest entry is "TensorRT 10.15 GA Release - 2026-2-2"), NVIDIA/TensorRT ``CHANGELOG.md`` on ``main``
(10.16, 11.0, 11.1), and ``docs/operators.md`` at the parser commits of ``release/10.14``
(c7272770), ``release/10.16`` (6bde6596) and ``release/11.1`` (7c51a63a), which pin the opset range
and the operator table. At the ``release/10.13`` parser commit (346bdcae) no ``operators.md`` is
stored; its ``onnxOpImporters.cpp`` has no ``Attention`` importer (it sits between ``Atanh`` and
``Add`` at 10.16's commit) and its README says "TensorRT 10.13 supports ONNX release 1.18.0"
(opset 23), which is taken as its opset bound. For versions between the stored ones, the facts of
the nearest stored version at or below are used and the rules say so (``inferred``).

``Attention`` (opset 23) parses from 10.14 (IAttention), with open parser/build bugs on 10.14-10.16
(NVIDIA/TensorRT#4705, #4732, #4738, #4739). vitdeploy's graphs keep attention as MatMul/Softmax at
opset 20, which every supported version reads; a graph that carries ``Attention`` is linted against
the target (refused before 10.14, flagged with those bugs after).

Restrictions are kept only where they touch ViT graphs (Resize, Q/DQ, Slice/Squeeze/Unsqueeze/Reduce/
Pad axes, GridSample, UINT8, LayerNormalization outputs); ``lint`` applies them node by node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .versions import TrtVersion

ONNX_TENSORRT = "github.com/onnx/onnx-tensorrt"

# -- importer lists ------------------------------------------------------------------------------
# 8.5-GA builtin_op_importers.cpp: every DEFINE_BUILTIN_OP_IMPORTER of the default ONNX domain
# (TensorRT-internal TRT_* importers left out).
_OPS_85 = frozenset(
    """
    Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh AveragePool BatchNormalization Cast Ceil Celu Clip
    Concat Constant ConstantOfShape Conv ConvTranspose Cos Cosh CumSum DepthToSpace DequantizeLinear Div Dropout
    Einsum Elu Equal Erf Exp Expand EyeLike Flatten Floor GRU Gather GatherElements GatherND Gemm
    GlobalAveragePool GlobalLpPool GlobalMaxPool Greater GreaterOrEqual GridSample HardSigmoid HardSwish Identity
    If ImageScaler InstanceNormalization IsNaN LRN LSTM LeakyRelu Less LessOrEqual Log LogSoftmax Loop
    LpNormalization LpPool MatMul Max MaxPool Mean MeanVarianceNormalization Min Mod Mul Neg NonMaxSuppression
    NonZero Not OneHot Or PRelu Pad ParametricSoftplus Pow QuantizeLinear RNN RandomNormal RandomNormalLike
    RandomUniform RandomUniformLike Range Reciprocal ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax
    ReduceMean ReduceMin ReduceProd ReduceSum ReduceSumSquare Relu Reshape Resize ReverseSequence RoiAlign Round
    ScaledTanh Scan Scatter ScatterElements ScatterND Selu Shape Shrink Sigmoid Sign Sin Sinh Size Slice Softmax
    Softplus Softsign SpaceToDepth Split Sqrt Squeeze Sub Sum Tan Tanh ThresholdedRelu Tile TopK Transpose Trilu
    Unsqueeze Upsample Where Xor
    """.split()
)
_OPS_86 = _OPS_85 | {"GroupNormalization", "IsInf", "LayerNormalization"}  # 8.6-GA builtin_op_importers.cpp
_OPS_101 = _OPS_86 | {"CastLike", "DeformConv", "Gelu", "Hardmax", "Mish"}  # 10.1-GA onnxOpImporters.cpp
# Reduce ops whose ``axes`` moved from attribute to input in opset 18 (ReduceSum did so in 13).
REDUCE_OPS_AXES_INPUT_18 = frozenset(
    "ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSumSquare".split()
)
RESIZE_TRANSFORMS = frozenset({"half_pixel", "pytorch_half_pixel", "tf_half_pixel_for_nn", "asymmetric", "align_corners"})
RESIZE_MODES = frozenset({"nearest", "linear", "cubic"})


@dataclass(frozen=True)
class ParserRules:
    """The ONNX parser of one TensorRT line, as the lint and the lowering need it."""

    key: str  # "8.5", "8.6", then MAJOR.MINOR of the version asked for ("10.3", "10.13", "11.4")
    covers: str  # which TensorRT versions these facts stand for
    source: str  # where they were read
    opset_min: int
    opset_max: int
    importers: frozenset[str]
    expands_functions: bool  # LocalFunctionImporter: model-local functions are inlined
    # Reduce* (opset 18 form) with axes as an input: 8.x's reduceTensor reads only the attribute and,
    # without it, reduces over every axis - a silently wrong result, not a parse error.
    reduce_axes_input: bool
    # Pad with an ``axes`` input (opset 18): 8.x reads pads for all axes and ignores it.
    pad_axes_input: bool
    # Resize attributes of opset 18+: 8.x reads neither antialias nor keep_aspect_ratio_policy nor axes.
    resize_opset18_attrs: bool
    uint8_io_only: bool  # UINT8 tensors only at network inputs/outputs (Cast from/to float only on 8.5)
    qdq_zero_point_required: bool  # 8.x: Q/DQ need the zero-point input (and it must be all zeros)
    slice_axes_constant: bool  # Slice ``axes`` must be an initializer
    gridsample_modes: frozenset[str]
    notes: tuple[str, ...] = field(default=())
    pad_axes_constant: bool = True  # Pad ``axes`` must be an initializer (tensor axes from 10.4)
    block_quantization: bool = False  # Q/DQ ``block_size`` (INT4/FP4 blocks; operators.md of 10.14+)
    # FP8 (float8e4m3fn) Q/DQ: onnx-tensorrt docs/operators.md of the TensorRT 9.2 parser lists "DequantizeLinear |
    # INT8, FP8" (and FP8 among MatMul/Gemm types), so every 10.x base has it; the 8.5/8.6 importers are INT8 only
    # (their operators.md lists no FP8 type; not re-read line by line: unconfirmed for 8.6)
    fp8_qdq: bool = False
    inferred: bool = False  # facts of the nearest stored parser source below this version
    changes: tuple[str, ...] = field(default=())  # what was applied on top of the base, with its source

    @property
    def attention(self) -> bool:
        """The opset-23 ``Attention`` op has an importer (IAttention, 10.14+)."""
        return "Attention" in self.importers

    @property
    def needs_lowering(self) -> bool:
        """Today's opset-20 bundle graphs need a rewrite to parse (8.x)."""
        return self.opset_max < 20

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "covers": self.covers, "source": self.source, "opset": [self.opset_min, self.opset_max],
                "importers": len(self.importers), "expands_functions": self.expands_functions, "attention": self.attention,
                "inferred": self.inferred, "changes": list(self.changes)}


_SRC_8 = "{repo} branch {branch}: docs/operators.md, builtin_op_importers.cpp, ModelImporter.cpp, onnx2trt_utils.cpp"
_GRID_8 = frozenset({"bilinear", "nearest", "bicubic"})
_GRID_10 = frozenset({"linear", "nearest", "cubic", "bilinear", "bicubic"})

RULES: dict[str, ParserRules] = {
    "8.5": ParserRules(
        key="8.5", covers="TensorRT 8.5.x (JetPack 5.1.x)",
        source=_SRC_8.format(repo=ONNX_TENSORRT, branch="8.5-GA"),
        opset_min=7, opset_max=17, importers=_OPS_85, expands_functions=False,
        reduce_axes_input=False, pad_axes_input=False, resize_opset18_attrs=False, uint8_io_only=True,
        qdq_zero_point_required=True, slice_axes_constant=True, gridsample_modes=_GRID_8,
        notes=("operators.md lists LayerNormalization as not supported; no Gelu importer (an opset-20 op)",),
    ),
    "8.6": ParserRules(
        key="8.6", covers="TensorRT 8.6.x (JetPack 6.0 ships 8.6.2)",
        source=_SRC_8.format(repo=ONNX_TENSORRT, branch="8.6-GA"),
        opset_min=7, opset_max=17, importers=_OPS_86, expands_functions=False,
        reduce_axes_input=False, pad_axes_input=False, resize_opset18_attrs=False, uint8_io_only=True,
        qdq_zero_point_required=True, slice_axes_constant=True, gridsample_modes=_GRID_8,
        notes=("no Gelu importer: 'No importer registered for op: Gelu. Attempting to import as plugin.' then fails",),
    ),
    "10.1": ParserRules(
        key="10.1", covers="TensorRT 10.0 to 10.2",
        source=f"{ONNX_TENSORRT} branch 10.1-GA: docs/operators.md, onnxOpImporters.cpp, ModelImporter.cpp",
        opset_min=9, opset_max=20, importers=_OPS_101, expands_functions=True,
        reduce_axes_input=True, pad_axes_input=True, resize_opset18_attrs=True, uint8_io_only=True,
        qdq_zero_point_required=False, slice_axes_constant=True, gridsample_modes=_GRID_10, fp8_qdq=True,
    ),
}

_CHANGELOG = f"{ONNX_TENSORRT} docs/Changelog.md"
_TRT_CHANGELOG = "NVIDIA/TensorRT CHANGELOG.md (main)"
_OPERATORS = f"{ONNX_TENSORRT} docs/operators.md"

# (first TensorRT version, field changes, where it was read). "+importers" adds operators.
_CHANGES: tuple[tuple[tuple[int, int], dict[str, Any], str], ...] = (
    ((10, 3), {"slice_axes_constant": False}, f"{_CHANGELOG}, 10.3 GA: 'Added support for tensor axes inputs for Slice nodes'"),
    ((10, 4), {"pad_axes_constant": False, "+importers": {"BlackmanWindow", "HammingWindow", "HannWindow"}},
     f"{_CHANGELOG}, 10.4 GA: tensor axes for Pad; BlackmanWindow/HammingWindow/HannWindow"),
    ((10, 5), {"+importers": {"STFT"}}, f"{_CHANGELOG}, 10.5 GA: real-valued STFT"),
    ((10, 13), {"opset_max": 23}, f"{ONNX_TENSORRT} README.md at 346bdcae (release/10.13 parser): 'TensorRT 10.13 supports "
     "ONNX release 1.18.0' (ONNX 1.18 = opset 23; no operators.md stored at that commit)"),
    ((10, 14), {"opset_max": 24, "block_quantization": True, "+importers": {"Attention"}},
     f"{_OPERATORS} at c7272770 (release/10.14 parser): opset 9 to 24, Attention 'Y', DequantizeLinear INT4/FP4; "
     f"{_CHANGELOG}, 10.14 GA: 'Added support for the Attention operator'"),
    ((10, 15), {"+importers": {"RotaryEmbedding", "RMSNormalization", "TensorScatter"}},
     f"{_CHANGELOG}, 10.15 GA; {_OPERATORS} at 6bde6596 (release/10.16 parser) lists all three"),
    ((11, 0), {"+importers": {"Swish"}}, f"{_TRT_CHANGELOG}, 11.0 GA parsers: 'Added support for Swish operator'; "
     f"{_OPERATORS} at 7c51a63a (release/11.1 parser): opset 9 to 24, Swish 'Y'"),
)
# Versions whose own parser sources are stored (everything else is inferred from the nearest below).
_STORED = {(10, 1), (10, 13), (10, 14), (10, 16), (11, 1)}

# Known parser/build bugs of the opset-23 Attention importer (open when this was written).
ATTENTION_ISSUES = (
    "NVIDIA/TensorRT#4705 (10.14: IAttention fails at serialization)",
    "NVIDIA/TensorRT#4732 (10.16: wrong results from the Attention layer)",
    "NVIDIA/TensorRT#4738 (10.16: Attention with KV cache outputs refused)",
    "NVIDIA/TensorRT#4739 (10.16: Attention inside an If subgraph fails to build)",
)


def _rules_10(v: TrtVersion) -> ParserRules:
    key = (v.major, v.minor)
    base = RULES["10.1"]
    values = {name: getattr(base, name) for name in base.__dataclass_fields__}
    importers = set(base.importers)
    applied = []
    for since, change, source in _CHANGES:
        if key < since:
            continue
        for name, value in change.items():
            if name == "+importers":
                importers |= value
            else:
                values[name] = value
        applied.append(f"{since[0]}.{since[1]}: {source}")
    if key < (10, 1):  # 10.1-GA is the base; DeformConv arrived in 10.1
        importers.discard("DeformConv")
        applied.append(f"10.0: {_CHANGELOG}, 10.1 GA: 'Added support for DeformConv operation' (so 10.0 has no DeformConv)")
    stored_at_or_below = max((s for s in _STORED if s <= key), default=(10, 1))
    values.update(
        key=f"{v.major}.{v.minor}", importers=frozenset(importers), changes=tuple(applied),
        covers=f"TensorRT {v.major}.{v.minor}", inferred=key not in _STORED,
        source=base.source + "".join(f"; {a}" for a in applied),
        notes=((f"no parser source stored for {v.major}.{v.minor}: facts of {stored_at_or_below[0]}.{stored_at_or_below[1]} "
                "and the changelog entries up to it",) if key not in _STORED else ()),
    )
    return ParserRules(**values)


def rules_for(version: str | TrtVersion) -> ParserRules:
    """The parser facts for a TensorRT version: 8.5/8.6 as read, 10.x/11.x as 10.1-GA plus the changes up to it."""
    v = version if isinstance(version, TrtVersion) else TrtVersion.parse(str(version))
    key = (v.major, v.minor)
    if key < (8, 6):
        return RULES["8.5"]
    if key < (10, 0):
        return RULES["8.6"]
    return _rules_10(v)


# The versions whose parser sources are stored, by key (for tests, docs and `--lint` reports).
RULES.update({key: _rules_10(TrtVersion.parse(key)) for key in ("10.3", "10.13", "10.14", "10.16", "11.1", "11.4")})
