"""`vitdeploy report`: one self-contained HTML page per bundle (identity, input contract, cost,
check evidence, precision, robustness, latency, engines) and a Hugging Face model card beside it,
both read from the records the other commands leave in the bundle."""

from .build import ReportOutcome, render, write_report

__all__ = ["ReportOutcome", "render", "write_report"]
