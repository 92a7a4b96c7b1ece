"""How each target wants its Q/DQ graph: the settings qdq.py quantizes with and the CPU variant adapts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class QuantSettings:
    """How one target wants its Q/DQ graph (types, symmetry, bias)."""

    target: str
    activation_type: str  # "QInt8" | "QUInt8"
    weight_type: str
    activation_symmetric: bool
    reduce_range: bool
    quantize_bias: bool
    description: str
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "activations": f"{self.activation_type} {'symmetric' if self.activation_symmetric else 'asymmetric'} per-tensor",
            "weights": f"{self.weight_type} symmetric per-channel{' (7-bit range)' if self.reduce_range else ''}",
            "bias": "int32 (quantized)" if self.quantize_bias else "float",
            "description": self.description,
        }


TENSORRT = QuantSettings(
    target="tensorrt",
    activation_type="QInt8",
    weight_type="QInt8",
    activation_symmetric=True,
    reduce_range=False,
    quantize_bias=False,  # TensorRT's parser rejects DequantizeLinear of int32 (quantized biases)
    description="explicit Q/DQ for TensorRT strongly typed builds: symmetric S8S8, per-channel weights",
)
