"""What each TensorRT's ONNX parser accepts, as data (no TensorRT import).

Every fact here was read from NVIDIA's ONNX parser sources (github.com/onnx/onnx-tensorrt), not
observed by running a parser: no TensorRT runs on the machines that wrote this. Per version:

- ``8.5``: branch ``8.5-GA`` (the parser of TensorRT 8.5, JetPack 5.1.x): ``docs/operators.md``
  ("supports operators up to Opset 17"), the importer list from ``builtin_op_importers.cpp``
  (``DEFINE_BUILTIN_OP_IMPORTER``), ``ModelImporter.cpp`` (ops without an importer fall to
  ``FallbackPluginImporter`` and fail unless a plugin of that name is registered; no ONNX
  function expansion), ``onnx2trt_utils.cpp`` (``canUseNDResize``, ``reduceTensor``).
- ``8.6``: branch ``8.6-GA`` (TensorRT 8.6; JetPack 6.0 ships 8.6.2), same files. Adds the
  ``LayerNormalization``, ``GroupNormalization`` and ``IsInf`` importers and the "UINT8 only as
  network input/output" check in ``ModelImporter.cpp``.
- ``10.1``: branch ``10.1-GA`` (the newest 10.x release branch of onnx-tensorrt), ``docs/operators.md``
  ("inclusive range of opset 9 to opset 20") and ``onnxOpImporters.cpp``. Adds ``Gelu``, ``CastLike``,
  ``Mish``, ``Hardmax``, ``DeformConv`` and ``LocalFunctionImporter`` (model-local functions are
  expanded). It stands for TensorRT 10.0 to 10.14 (JetPack 6.1/6.2 ship 10.3): onnx-tensorrt has no
  release branch for those, and importers are only ever added, so 10.1's list is their lower bound.
- ``10.15``: ``docs/operators.md`` of the TensorRT 10.15 parser (opset 9 to 24; adds ``Attention``,
  ``RMSNormalization``, ``RotaryEmbedding``, ``TensorScatter``, the window ops and ``STFT``).
- ``11.1``: ``docs/operators.md`` at onnx-tensorrt commit 7c51a63a (the ``parsers/onnx`` submodule of
  NVIDIA/TensorRT ``release/11.1``): opset 9 to 24, adds ``Swish``. It stands for every 11.x (the
  newest parser source published when this was written).

Restrictions are kept only where they touch ViT graphs (Resize, Q/DQ, Slice/Squeeze/Unsqueeze/Reduce
axes, Pad, GridSample, UINT8, LayerNormalization outputs); ``lint`` applies them node by node.
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
# docs/operators.md rows marked "Y" that 10.1-GA did not have
_OPS_1015 = _OPS_101 | {
    "Attention", "BlackmanWindow", "HammingWindow", "HannWindow", "RMSNormalization", "RotaryEmbedding",
    "STFT", "TensorScatter",
}
_OPS_111 = _OPS_1015 | {"Swish"}

# Reduce ops whose ``axes`` moved from attribute to input in opset 18 (ReduceSum did so in 13).
REDUCE_OPS_AXES_INPUT_18 = frozenset(
    "ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSumSquare".split()
)
RESIZE_TRANSFORMS = frozenset({"half_pixel", "pytorch_half_pixel", "tf_half_pixel_for_nn", "asymmetric", "align_corners"})
RESIZE_MODES = frozenset({"nearest", "linear", "cubic"})


@dataclass(frozen=True)
class ParserRules:
    """The ONNX parser of one TensorRT line, as the lint and the lowering need it."""

    key: str  # "8.5", "8.6", "10.1", "10.15", "11.1"
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

    @property
    def needs_lowering(self) -> bool:
        """Today's opset-20 bundle graphs need a rewrite to parse (8.x)."""
        return self.opset_max < 20

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "covers": self.covers, "source": self.source, "opset": [self.opset_min, self.opset_max],
                "importers": len(self.importers), "expands_functions": self.expands_functions}


_SRC_8 = "{repo} branch {branch}: docs/operators.md, builtin_op_importers.cpp, ModelImporter.cpp, onnx2trt_utils.cpp"

RULES: dict[str, ParserRules] = {
    "8.5": ParserRules(
        key="8.5", covers="TensorRT 8.5.x (JetPack 5.1.x)",
        source=_SRC_8.format(repo=ONNX_TENSORRT, branch="8.5-GA"),
        opset_min=7, opset_max=17, importers=_OPS_85, expands_functions=False,
        reduce_axes_input=False, pad_axes_input=False, resize_opset18_attrs=False, uint8_io_only=True,
        qdq_zero_point_required=True, slice_axes_constant=True, gridsample_modes=frozenset({"bilinear", "nearest", "bicubic"}),
        notes=("operators.md lists LayerNormalization as not supported; no Gelu importer (an opset-20 op)",),
    ),
    "8.6": ParserRules(
        key="8.6", covers="TensorRT 8.6.x (JetPack 6.0 ships 8.6.2)",
        source=_SRC_8.format(repo=ONNX_TENSORRT, branch="8.6-GA"),
        opset_min=7, opset_max=17, importers=_OPS_86, expands_functions=False,
        reduce_axes_input=False, pad_axes_input=False, resize_opset18_attrs=False, uint8_io_only=True,
        qdq_zero_point_required=True, slice_axes_constant=True, gridsample_modes=frozenset({"bilinear", "nearest", "bicubic"}),
        notes=("no Gelu importer: 'No importer registered for op: Gelu. Attempting to import as plugin.' then fails",),
    ),
    "10.1": ParserRules(
        key="10.1", covers="TensorRT 10.0 to 10.14 (JetPack 6.1/6.2 ship 10.3)",
        source=f"{ONNX_TENSORRT} branch 10.1-GA: docs/operators.md, onnxOpImporters.cpp, ModelImporter.cpp "
        "(the newest 10.x release branch; importers are only added later, so it is the lower bound for 10.2-10.14)",
        opset_min=9, opset_max=20, importers=_OPS_101, expands_functions=True,
        reduce_axes_input=True, pad_axes_input=True, resize_opset18_attrs=True, uint8_io_only=True,
        qdq_zero_point_required=False, slice_axes_constant=True, gridsample_modes=frozenset({"linear", "nearest", "cubic", "bilinear", "bicubic"}),
    ),
    "10.15": ParserRules(
        key="10.15", covers="TensorRT 10.15 and later 10.x",
        source=f"{ONNX_TENSORRT} docs/operators.md of the TensorRT 10.15 parser",
        opset_min=9, opset_max=24, importers=_OPS_1015, expands_functions=True,
        reduce_axes_input=True, pad_axes_input=True, resize_opset18_attrs=True, uint8_io_only=True,
        qdq_zero_point_required=False, slice_axes_constant=False, gridsample_modes=frozenset({"linear", "nearest", "cubic", "bilinear", "bicubic"}),
    ),
    "11.1": ParserRules(
        key="11.1", covers="TensorRT 11.x (the newest parser source published: 11.1)",
        source=f"{ONNX_TENSORRT} docs/operators.md at 7c51a63a (parsers/onnx of NVIDIA/TensorRT release/11.1)",
        opset_min=9, opset_max=24, importers=_OPS_111, expands_functions=True,
        reduce_axes_input=True, pad_axes_input=True, resize_opset18_attrs=True, uint8_io_only=True,
        qdq_zero_point_required=False, slice_axes_constant=False, gridsample_modes=frozenset({"linear", "nearest", "cubic", "bilinear", "bicubic"}),
    ),
}


def rules_for(version: str | TrtVersion) -> ParserRules:
    """The parser facts for a TensorRT version (the nearest published parser source at or below it)."""
    v = version if isinstance(version, TrtVersion) else TrtVersion.parse(str(version))
    key = (v.major, v.minor)
    if key < (8, 6):
        return RULES["8.5"]
    if key < (10, 0):
        return RULES["8.6"]
    if key < (10, 15):
        return RULES["10.1"]
    if key < (11, 0):
        return RULES["10.15"]
    return RULES["11.1"]
