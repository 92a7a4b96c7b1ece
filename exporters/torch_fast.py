"""PyTorch as a deployment baseline: what a careful PyTorch user would run, for `profile`.

:class:`~vitdeploy.exporters.torch_runner.TorchRunner` is the *reference* (``check`` compares every
artifact with it; it normalises on the host in numpy on purpose). As a speed baseline that is
unfair to PyTorch: on an H200 it was ~11x slower than a bare CUDA-graph loop at batch 8 (issue 14),
because it normalised in numpy, uploaded float32 and timed host work. This runner is the baseline a
TensorRT number should be compared with:

* the uint8 NHWC batch is staged in pinned host memory and uploaded as uint8 (4x fewer bytes than
  float32); channel flip, resize and normalisation run on the device, fused into one multiply-add;
* ``torch.inference_mode``, weights cast to the cell's dtype on the host before the upload (so the
  device never holds an fp32 copy of an fp16 model);
* static input/output buffers per input shape (pinned on the host), so ``cuda-graph`` can replay
  one captured graph (normalisation, model, softmax) per call and the outputs come back by async
  copies into pinned memory with one synchronisation;
* ``compile``: ``torch.compile`` of that same forward (normalisation fused into the first kernels);
* on CUDA, device time from CUDA events around the forward (``last_device_time_s``), beside the
  host wall time of the whole call (upload, forward, download) that ``Runner.infer`` records.

Modes: ``eager``, ``cuda-graph`` (CUDA only), ``compile`` and ``auto``. ``auto`` takes the faster of
the modes that cost no compilation: on CUDA it captures a graph and times it against eager on the
first batch of each shape (falling back to eager if capture fails); on the CPU it is eager. It never
picks ``compile`` by itself: compiling adds tens of seconds (minutes on a small CPU) of start-up per
input shape, which a user opts into. The mode that ran is in ``info.details["torch_mode"]``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from vitdeploy import precisions
from vitdeploy.bundle import Bundle
from vitdeploy.errors import UserError
from vitdeploy.runtime.base import Runner, RunnerInfo, TensorInfo

from .sources import LoadedModel

MODES = ("eager", "cuda-graph", "compile")
HEAD_OUTPUTS = ("logits", "probs")
REQUESTABLE = ("auto", *MODES)
AUTO_TRIAL_CALLS = 5  # timed calls per candidate when `auto` chooses (after one untimed call each)
GRAPH_WARMUP = 3  # eager calls on a side stream before capture (cuBLAS handles, autotuning, lazy inits)


def _default_outputs(loaded: LoadedModel) -> tuple[str, ...]:
    try:
        from .features import default_outputs
    except ImportError:  # a tree without feature outputs: classifiers only
        return HEAD_OUTPUTS
    return tuple(default_outputs(loaded))


def check_mode(mode: str, device: str) -> str:
    """Validate a requested mode for a device; one clear line for what cannot run."""
    mode = (mode or "auto").strip().lower()
    if mode not in REQUESTABLE:
        raise UserError(f"unknown torch mode {mode!r}; choose from {', '.join(REQUESTABLE)}")
    if mode == "cuda-graph" and not device.startswith("cuda"):
        raise UserError("torch mode cuda-graph replays a CUDA graph and needs a GPU; torch runs on the CPU here (use eager or compile)")
    return mode


@dataclass
class _ShapeState:
    """Buffers (and the captured graph) for one input shape."""

    host_in: torch.Tensor  # pinned on CUDA: the uint8 (or float) batch is copied here, then uploaded
    dev_in: torch.Tensor
    host_out: list[torch.Tensor] = field(default_factory=list)  # pinned, one per output
    dev_out: tuple[torch.Tensor, ...] | None = None  # the graph's static outputs
    graph: Any = None  # torch.cuda.CUDAGraph
    mode: str = "eager"
    trial_ms: dict[str, float] = field(default_factory=dict)


class FastTorchRunner(Runner):
    """The fast PyTorch path (see the module docstring); same Runner interface as TorchRunner."""

    def __init__(self, loaded: LoadedModel, preprocessing: dict[str, Any], device: str = "cpu", dtype: str = "fp32",
                 resize_to: tuple[int, int] | None = None, threads: int | None = None, mode: str = "auto",
                 compile_backend: str = "inductor", compile_mode: str | None = None,
                 outputs: tuple[str, ...] | None = None, normalize_embedding: bool = False):
        if threads:
            torch.set_num_threads(int(threads))
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise UserError("the torch backend was asked for CUDA but torch sees no GPU; use --device cpu")
        with_torch = [p.name for p in precisions.REGISTRY if p.torch_dtype]
        if dtype not in with_torch:
            raise UserError(f"the torch backend runs {precisions.listing(with_torch, 'or')}, not {dtype!r}")
        if dtype == "fp16" and not device.startswith("cuda"):
            raise UserError("PyTorch fp16 is a GPU baseline; on the CPU use fp32")
        self.requested_mode = check_mode(mode, device)
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.torch_dtype = getattr(torch, precisions.get(dtype).torch_dtype)
        self.preprocessing = preprocessing
        self.float_input = preprocessing.get("input") == "float-nchw"
        self.bgr = preprocessing.get("channel_order", "rgb") == "bgr"
        self.resize_to = tuple(resize_to) if resize_to else None
        self.loaded = loaded
        # the graph's outputs (a backbone export has embedding / patch_grid instead of logits, probs)
        self.output_names = tuple(outputs or loaded.extra.get("outputs") or _default_outputs(loaded))
        self.normalize_embedding = normalize_embedding
        model = loaded.model.eval()
        for param in model.parameters():
            param.requires_grad_(False)
        if dtype == "fp16":
            model = model.half()  # on the host first: the device never holds an fp32 copy
        self.model = model.to(self.device)
        # (x / 255 - mean) / std == x * scale + shift: one fused multiply-add on the device
        mean = torch.tensor(preprocessing.get("mean", [0.0, 0.0, 0.0]), dtype=torch.float32).view(1, 3, 1, 1)
        std = torch.tensor(preprocessing.get("std", [1.0, 1.0, 1.0]), dtype=torch.float32).view(1, 3, 1, 1)
        self._scale = (1.0 / (255.0 * std)).to(self.device)
        self._shift = (-mean / std).to(self.device)
        self._states: dict[tuple[int, ...], _ShapeState] = {}
        self._compiled: Callable[[torch.Tensor], tuple[torch.Tensor, ...]] | None = None
        if self.requested_mode == "compile":
            self._compiled = self._compile(compile_backend, compile_mode)
        if self.cuda:
            self.last_device_time_s = float("nan")
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)
        where = f"cuda:{torch.cuda.current_device() if self.device.index is None else self.device.index}" if self.cuda else "cpu"
        pipeline = "float NCHW upload" if self.float_input else "uint8 upload, normalisation on the device"
        self.info = RunnerInfo(backend="torch", precision=dtype, device=where, details={
            "torch": torch.__version__, "threads": torch.get_num_threads(), "source": loaded.source.get("name"),
            "torch_mode": None if self.requested_mode == "auto" else self.requested_mode,  # auto: set on the first call
            "torch_mode_requested": self.requested_mode,
            "pipeline": pipeline + ", inference_mode",
        })
        if self.requested_mode == "compile":
            self.info.details["compile_backend"] = compile_backend

    @classmethod
    def from_bundle(cls, bundle: Bundle, device: str = "cpu", dtype: str = "fp32", resolution: tuple[int, int] | None = None,
                    threads: int | None = None, mode: str = "auto", **compile_options: Any) -> "FastTorchRunner":
        """Rebuild the bundle's source model (same weights and resolution handling as its graph)."""
        from .torch_runner import bundle_contract

        check_mode(mode, device)  # refuse before the model is built
        loaded, contract = bundle_contract(bundle, resolution)
        return cls(loaded, device=device, dtype=dtype, threads=threads, mode=mode, **contract, **compile_options)

    # -- the Runner interface ------------------------------------------------------------------
    def inputs(self) -> list[TensorInfo]:
        if self.float_input:
            return [TensorInfo("images", "float32", ("batch", 3, "height", "width"))]
        return [TensorInfo("images", "uint8", ("batch", "height", "width", 3))]

    def outputs(self) -> list[str]:
        return list(self.output_names)

    def close(self) -> None:
        self._states.clear()
        self._compiled = None
        self.model = self.loaded = None  # type: ignore[assignment]  (the weights: freed before the cache is emptied)
        if self.cuda:
            torch.cuda.synchronize(self.device)
            # Hand the cached blocks back to the driver: the next cell (ORT, TensorRT, another
            # torch cell) is measured from a clean device, not from this cell's leftovers.
            torch.cuda.empty_cache()

    def _run(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        batch = self._validate(batch)
        state = self._states.get(batch.shape)
        if state is None:
            state = self._prepare(batch)
            self._states[batch.shape] = state
        with torch.inference_mode():
            np.copyto(state.host_in.numpy(), batch)  # host memcpy into the (pinned) staging buffer
            if not self.cuda:
                outs = self._call(state, state.host_in)
                return {name: t.numpy().copy() for name, t in zip(self.output_names, outs)}
            state.dev_in.copy_(state.host_in, non_blocking=True)
            self._start.record()
            outs = self._call(state, state.dev_in)
            self._end.record()
            for host, dev in zip(state.host_out, outs):
                host.copy_(dev, non_blocking=True)
            torch.cuda.current_stream(self.device).synchronize()
            self.last_device_time_s = self._start.elapsed_time(self._end) / 1e3
            return {name: host.numpy().copy() for name, host in zip(self.output_names, state.host_out)}

    # -- internals -----------------------------------------------------------------------------
    def _validate(self, batch: np.ndarray) -> np.ndarray:
        if self.float_input:
            if batch.ndim != 4 or batch.shape[1] != 3:
                raise UserError(f"expected float images [N,3,H,W], got {batch.dtype} {list(batch.shape)}")
            return np.ascontiguousarray(batch, dtype=np.float32)
        if batch.dtype != np.uint8 or batch.ndim != 4 or batch.shape[-1] != 3:
            raise UserError(f"expected uint8 images [N,H,W,3], got {batch.dtype} {list(batch.shape)}")
        return np.ascontiguousarray(batch)

    def _forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Device-side preprocessing, the model and softmax: uint8 NHWC -> the outputs, in order."""
        if self.float_input:
            x = x.to(self.torch_dtype)
        else:
            # NHWC uint8 -> contiguous NCHW float in one copy: the model gets the layout a PyTorch
            # user feeds it (a permuted view would reach the patch-embedding conv as channels-last)
            x = x.permute(0, 3, 1, 2).to(torch.float32, memory_format=torch.contiguous_format)
            if self.bgr:
                x = x.flip(1)  # the graph takes BGR; the model was trained on RGB
            if self.resize_to is not None:
                x = F.interpolate(x, size=self.resize_to, mode="bilinear", align_corners=False, antialias=False)
            x = torch.addcmul(self._shift, x, self._scale).to(self.torch_dtype)
        if self.output_names == HEAD_OUTPUTS:
            logits = self.model(x).float()
            return logits, torch.softmax(logits, -1)
        from .features import forward_outputs

        out = forward_outputs(self.loaded, x, self.output_names, self.normalize_embedding, model=self.model)
        if "probs" in out:  # softmax in fp32 even for an fp16 model, as the deployed graph does
            out["probs"] = torch.softmax(out["logits"].float(), -1)
        return tuple(out[name].float() for name in self.output_names)

    def _call(self, state: _ShapeState, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if state.graph is not None:
            state.graph.replay()
            assert state.dev_out is not None
            return state.dev_out
        if self._compiled is not None:
            return self._compiled(x)
        return self._forward(x)

    def _compile(self, backend: str, mode: str | None) -> Callable[[torch.Tensor], tuple[torch.Tensor, ...]]:
        import torch._dynamo as dynamo

        # Every runner compiles its own forward (one per profile cell). Dynamo keys its cache on the
        # code object, so cells share one budget of recompiles; past it, dynamo silently runs eager.
        # A sweep of many cells must not fall back to eager without saying so.
        config = dynamo.config
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(config, name):
                setattr(config, name, max(int(getattr(config, name)), 64))
        try:
            return torch.compile(self._forward, backend=backend, mode=mode, dynamic=False)
        except Exception as exc:  # e.g. an unknown backend name
            raise UserError(f"torch.compile could not be set up ({type(exc).__name__}: {exc}); use --torch-mode eager") from None

    def _prepare(self, batch: np.ndarray) -> _ShapeState:
        """Buffers for a new shape; on CUDA, capture its graph (cuda-graph, or auto's trial)."""
        host = torch.empty(batch.shape, dtype=torch.from_numpy(batch[:0]).dtype, pin_memory=self.cuda)
        state = _ShapeState(host_in=host, dev_in=host if not self.cuda else torch.empty(batch.shape, dtype=host.dtype, device=self.device))
        mode = self.requested_mode
        if mode in ("eager", "compile"):
            state.mode = mode
        elif not self.cuda:  # auto on the CPU: eager (compile is opt-in; cuda-graph was refused)
            state.mode = "eager"
        else:
            np.copyto(host.numpy(), batch)
            state.dev_in.copy_(host)
            try:
                self._capture(state)
            except Exception as exc:
                if mode == "cuda-graph":
                    raise UserError(f"CUDA graph capture failed for this model ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                                    "use --torch-mode eager") from None
                state.graph, state.dev_out = None, None
                self.info.details["auto_fallback"] = f"CUDA graph capture failed ({type(exc).__name__}); eager"
                state.mode = "eager"
            else:
                state.mode = "cuda-graph"
                if mode == "auto":
                    state.mode = self._auto_choice(state)
        if self.cuda:
            with torch.inference_mode():
                probe = state.dev_out if state.dev_out is not None else self._call(state, state.dev_in)
            state.host_out = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in probe]
        self.info.details["torch_mode"] = state.mode
        if state.trial_ms:
            self.info.details["auto_trial_ms"] = dict(state.trial_ms)
        return state

    def _capture(self, state: _ShapeState) -> None:
        with torch.inference_mode():
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(GRAPH_WARMUP):
                    self._forward(state.dev_in)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                state.dev_out = self._forward(state.dev_in)
            state.graph = graph

    def _auto_choice(self, state: _ShapeState) -> str:
        """Time graph replay against eager on this shape; keep the faster (drop the graph if eager wins)."""
        def timed(call: Callable[[], Any]) -> float:
            with torch.inference_mode():
                call()
                torch.cuda.synchronize(self.device)
                samples = []
                for _ in range(AUTO_TRIAL_CALLS):
                    t0 = time.perf_counter()
                    call()
                    torch.cuda.synchronize(self.device)
                    samples.append(time.perf_counter() - t0)
            return float(np.median(samples)) * 1e3

        graph = state.graph
        state.trial_ms = {"cuda-graph": timed(graph.replay), "eager": timed(lambda: self._forward(state.dev_in))}
        if state.trial_ms["eager"] < state.trial_ms["cuda-graph"]:
            state.graph, state.dev_out = None, None
            return "eager"
        return "cuda-graph"
