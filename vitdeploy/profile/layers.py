"""trtexec's per-layer exports, parsed: ``--exportProfile`` JSON, the ``--dumpProfile`` table in a log, and
``--exportLayerInfo`` JSON; and the ONNX node names each TensorRT layer came from.

Formats, as written by trtexec's own code (NVIDIA/TensorRT ``samples/common/sampleReporting.cpp``,
``Profiler::exportJSONProfile`` and ``Profiler::print``) and as seen in real exported files:

- profile JSON: ``[{"count": N}, {"name", "timeMs", "averageMs", "medianMs", "percentage"}, ...]``;
  ``medianMs`` since 8.4 (absent at ``release/8.2`` and before, present at ``release/8.4`` .. ``release/11.1``);
  ``timeMs`` is the total over ``count`` profiled runs, ``percentage`` = timeMs / total x 100.
- the log table (``--dumpProfile``): 8.6 .. 11.x print ``Time(ms) Avg.(ms) Median(ms) Time(%) Layer`` with the
  name last and a ``Total`` row; 8.4/8.5 printed ``Layer Time (ms) Avg. Time (ms) Median Time (ms) Time %``
  with the name first (NVIDIA/TensorRT#2577 quotes one), 8.2 and before the same without the median.
- layer info JSON: ``{"Layers": [...], "Bindings": [...]}``; with ``--profilingVerbosity=detailed`` each
  layer is an object (``Name``, ``LayerType``, ``Inputs``/``Outputs`` with ``Format/Datatype``, ``TacticName``
  ...) and from 8.6 a ``Metadata`` string listing ``[ONNX Layer: <node>]`` records (separated by \\x1e, or
  \\x1f where Myelin merged them); with the default verbosity only the names.
  TensorRT 11 is reported to split ``Format/Datatype`` into ``Datatype`` and ``Format`` (a comment in a
  public Polygraphy-based tool; no 11.x export was found to confirm it): both forms are read.

A fused layer's name lists its ONNX nodes: ``a + b``, ``PWN(a, PWN(b, c))``, ``a || b``,
``{ForeignNode[first...last]}`` (a Myelin region spanning the nodes between two names), Myelin kernels
``node_linear_myl7_1`` (node ``node_linear``) and ``__myl_*``/``__mye*`` internals (no node),
``Reformatting CopyNode for Input Tensor 0 to X`` (a copy feeding X) and TensorRT 7's ``X input reformatter 0``.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..errors import UserError


@dataclass
class LayerTime:
    name: str
    total_ms: float  # over every profiled run
    avg_ms: float  # per inference
    median_ms: Optional[float]
    percentage: Optional[float]


@dataclass
class LayerProfile:
    """One profile of one engine: the per-layer times and the totals its file states."""

    layers: List[LayerTime]
    runs: Optional[int]
    format: str  # "profile-json" | "profile-json-no-median" | "log-table" | "log-table-name-first" ...
    stated_total_ms: Optional[float] = None  # the log table's Total row (sum over runs)
    stated_avg_ms: Optional[float] = None  # the Total row's per-inference average

    @property
    def total_ms(self) -> float:
        return sum(layer.total_ms for layer in self.layers)

    @property
    def avg_ms(self) -> float:
        return sum(layer.avg_ms for layer in self.layers)

    def implied_total_ms(self) -> Optional[float]:
        """The total the file's own percentages imply (timeMs / percentage), from its largest layer."""
        rows = [r for r in self.layers if r.percentage]
        if not rows:
            return None
        big = max(rows, key=lambda r: r.percentage or 0.0)
        return big.total_ms / (big.percentage / 100.0)  # type: ignore[operator]

    def to_dict(self) -> Dict[str, Any]:
        return {"format": self.format, "runs": self.runs, "layers": [asdict(r) for r in self.layers], "total_ms": self.total_ms,
                "avg_ms": self.avg_ms, "stated_total_ms": self.stated_total_ms, "stated_avg_ms": self.stated_avg_ms}


def parse_profile_json(text: str) -> LayerProfile:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"not a trtexec --exportProfile JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, list) or not data:
        raise UserError("not a trtexec --exportProfile JSON: expected a list starting with {\"count\": N}")
    runs = data[0].get("count") if isinstance(data[0], dict) and "count" in data[0] else None
    rows = data[1:] if runs is not None else data
    layers, median = [], True
    for row in rows:
        if not isinstance(row, dict) or "name" not in row or "averageMs" not in row:
            raise UserError(f"not a trtexec --exportProfile entry: {str(row)[:120]}")
        median = median and "medianMs" in row
        layers.append(LayerTime(str(row["name"]), float(row.get("timeMs", 0.0)), float(row["averageMs"]),
                                float(row["medianMs"]) if "medianMs" in row else None,
                                float(row["percentage"]) if "percentage" in row else None))
    return LayerProfile(layers, int(runs) if runs is not None else None, "profile-json" if median else "profile-json-no-median")


_LOG_PREFIX = re.compile(r"^\s*\[\d\d/\d\d/\d{4}-\d\d:\d\d:\d\d\] \[[A-Z]\] ?")
_PROFILE_HEAD = re.compile(r"=== Profile \((\d+) iterations ?\) ===")
_NUM = r"(-?\d+(?:\.\d+)?)"
_ROW_NAME_LAST = re.compile(rf"^\s*{_NUM}\s+{_NUM}\s+{_NUM}\s+{_NUM}\s{{3}}(.+?)\s*$")
_ROW_NAME_FIRST = re.compile(rf"^\s*(.+?)\s+{_NUM}\s+{_NUM}\s+{_NUM}(?:\s+{_NUM})?\s*$")


def parse_profile_log(text: str) -> LayerProfile:
    """The ``=== Profile (N iterations ) ===`` table of a trtexec log (the last one, if several)."""
    lines = [_LOG_PREFIX.sub("", line) for line in text.splitlines()]
    heads = [i for i, line in enumerate(lines) if _PROFILE_HEAD.search(line)]
    if not heads:
        raise UserError("no '=== Profile (N iterations ) ===' table in this log: run trtexec with --dumpProfile")
    start = heads[-1]
    runs = int(_PROFILE_HEAD.search(lines[start]).group(1))  # type: ignore[union-attr]
    header = lines[start + 1] if start + 1 < len(lines) else ""
    name_first = header.strip().startswith("Layer")
    has_median = "Median" in header
    layers: List[LayerTime] = []
    total = avg_total = None
    for line in lines[start + 2:]:
        if not line.strip():
            break
        if name_first:
            m = _ROW_NAME_FIRST.match(line)
            if not m:
                break
            name, t, a = m.group(1), float(m.group(2)), float(m.group(3))
            med, pct = (float(m.group(4)), float(m.group(5))) if has_median and m.group(5) else (None, float(m.group(4)))
        else:
            m = _ROW_NAME_LAST.match(line)
            if not m:
                break
            t, a, med, pct, name = float(m.group(1)), float(m.group(2)), float(m.group(3)), float(m.group(4)), m.group(5)
        if name.strip() == "Total":
            total, avg_total = t, a
            continue
        layers.append(LayerTime(name.strip(), t, a, med, pct))
    if not layers:
        raise UserError("the log's profile table has no layer rows")
    fmt = "log-table" if not name_first else ("log-table-name-first" if has_median else "log-table-name-first-no-median")
    return LayerProfile(layers, runs, fmt, total, avg_total)


def read_text(path: str | Path) -> str:
    """A trtexec export as text (``.gz`` read through gzip: exports of big engines are often kept compressed)."""
    p = Path(path)
    try:
        if p.suffix == ".gz":
            import gzip

            return gzip.decompress(p.read_bytes()).decode("utf-8", errors="replace")
        return p.read_text(errors="replace")
    except OSError as exc:
        raise UserError(f"cannot read {p}: {exc.strerror}") from None
    except (EOFError, ValueError) as exc:  # gzip.BadGzipFile is an OSError subclass; truncated streams raise EOFError
        raise UserError(f"{p} is not a readable gzip file ({exc})") from None


def load_profile(path: str | Path) -> LayerProfile:
    """A profile from a file trtexec wrote: --exportProfile JSON, or a log with the --dumpProfile table."""
    text = read_text(path)
    if text.lstrip().startswith("["):
        return parse_profile_json(text)
    return parse_profile_log(text)


# -- layer information ------------------------------------------------------------------------------
@dataclass
class LayerInfo:
    name: str
    layer_type: Optional[str] = None
    onnx_nodes: List[str] = field(default_factory=list)  # from Metadata (8.6+, detailed)
    tactic: Optional[str] = None
    output_types: List[str] = field(default_factory=list)


@dataclass
class EngineLayers:
    layers: List[LayerInfo]
    bindings: List[str]
    detailed: bool


_ONNX_META = re.compile(r"\[ONNX Layer: ([^\]]+)\]")


def _tensor_type(tensor: Dict[str, Any]) -> str:
    if "Format/Datatype" in tensor:  # 8.x .. 10.x
        return str(tensor["Format/Datatype"])
    return " ".join(str(tensor[k]) for k in ("Datatype", "Format") if tensor.get(k))  # 11.x form, as reported


def parse_layer_info(text: str) -> EngineLayers:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"not a trtexec --exportLayerInfo JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict) or not isinstance(data.get("Layers"), list):
        raise UserError("not a trtexec --exportLayerInfo JSON: expected {\"Layers\": [...], \"Bindings\": [...]}")
    out, detailed = [], False
    for entry in data["Layers"]:
        if isinstance(entry, str):
            out.append(LayerInfo(entry))
            continue
        detailed = True
        meta = str(entry.get("Metadata") or "")
        out.append(LayerInfo(str(entry.get("Name", "")), entry.get("LayerType"), _ONNX_META.findall(meta), entry.get("TacticName"),
                             [_tensor_type(t) for t in entry.get("Outputs") or [] if isinstance(t, dict)]))
    return EngineLayers(out, [str(b) for b in data.get("Bindings") or []], detailed)


def load_layer_info(path: str | Path) -> EngineLayers:
    return parse_layer_info(read_text(path))


# -- ONNX node names in a TensorRT layer name ---------------------------------------------------------
_REFORMAT = re.compile(r"^Reformatting CopyNode for (Input|Output) Tensor \d+ to (.+)$")
_OLD_REFORMAT = re.compile(r"^(.+?) (?:input|output) reformatter \d+$")
_FOREIGN = re.compile(r"\{ForeignNode\[(.+?)\.\.\.(.+?)\]\}")
_MYELIN_SUFFIX = re.compile(r"_myl\d+_\d+$")
_UNNAMED = re.compile(r"\(Unnamed Layer\* \d+\) \[[^\]]+\]")
_CLONE = re.compile(r"_clone_\d+$")


@dataclass(frozen=True)
class LayerNodes:
    """What a TensorRT layer name says about its ONNX origin."""

    kind: str  # "compute" | "reformat" | "myelin-internal" | "constant"
    nodes: Tuple[str, ...]  # ONNX node (or tensor) names named in it
    spans: Tuple[Tuple[str, str], ...] = ()  # ForeignNode[first...last] ranges


def nodes_in_name(name: str) -> LayerNodes:
    text = name.strip()
    m = _REFORMAT.match(text)
    if m:
        inner = nodes_in_name(m.group(2))
        return LayerNodes("reformat", inner.nodes, inner.spans)
    m = _OLD_REFORMAT.match(text)
    if m:
        inner = nodes_in_name(m.group(1))
        return LayerNodes("reformat", inner.nodes, inner.spans)
    if text.startswith("__my"):
        return LayerNodes("myelin-internal", ())
    spans = tuple((a.strip(), b.strip()) for a, b in _FOREIGN.findall(text))
    text = _FOREIGN.sub(" ", text)
    text = _UNNAMED.sub(" ", text)
    parts: List[str] = []
    for token in re.split(r"\s*(?:\+|\|\||,)\s*|PWN\(|[()]", text):
        token = token.strip()
        if not token or token.startswith("__my"):
            continue
        token = _CLONE.sub("", _MYELIN_SUFFIX.sub("", token))
        if token not in parts:
            parts.append(token)
    if not parts and not spans:
        return LayerNodes("constant" if "Unnamed Layer" in name else "myelin-internal", ())
    return LayerNodes("compute", tuple(parts), spans)


# -- what the trtexec log says about the run (the device state a latency depends on) ----------------------
_RUNNING = re.compile(r"&&&& RUNNING TensorRT\.trtexec \[TensorRT v(\d+)\] \[b\d+\] # (.+)$")
_LOG_FIELDS = ("Selected Device", "Compute Capability", "SMs", "Application Compute Clock Rate", "Application Memory Clock Rate",
               "Compute Clock Rate", "Memory Clock Rate", "Input inference shape", "Input inference shapes", "Data transfers",
               "Spin-wait", "CUDA Graph", "Separate profiling", "Iterations", "Duration", "Streams", "Precision")


def _trt_from_number(number: str) -> str:
    """trtexec prints 'v101601' for 10.16.1, 'v8601' for 8.6.1 (MAJOR, 2-digit MINOR, 2-digit PATCH)."""
    n = int(number)
    return f"{n // 10000}.{(n // 100) % 100}.{n % 100}"


def parse_trtexec_log(text: str) -> Dict[str, Any]:
    """The run's TensorRT version, command line, device and inference options from a trtexec log."""
    out: Dict[str, Any] = {}
    for raw in text.splitlines():
        m = _RUNNING.search(raw)
        if m and "tensorrt" not in out:
            out["tensorrt"] = _trt_from_number(m.group(1))
            out["command"] = m.group(2).strip()
            continue
        line = _LOG_PREFIX.sub("", raw).strip()
        key, sep, value = line.partition(":")
        if sep and key.strip() in _LOG_FIELDS and key.strip() not in out:
            out[key.strip()] = value.strip()
    return out
