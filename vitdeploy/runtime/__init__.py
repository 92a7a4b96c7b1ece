"""Runners for deployed artifacts. Imports neither torch nor tensorrt at import time."""

from .base import Runner, RunnerInfo, TensorInfo

__all__ = ["Runner", "RunnerInfo", "TensorInfo"]
