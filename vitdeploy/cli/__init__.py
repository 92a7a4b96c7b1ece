"""The `vitdeploy` command line: a thin Click layer over the library.

Each command lives in its own module ``vitdeploy/cli/cmd_<name>.py`` that exposes ``command``;
they are collected here. Command modules import only click and vitdeploy's light core at import
time, so ``vitdeploy --help`` and every ``<cmd> --help`` work without torch, onnxruntime or
tensorrt installed.
"""

from __future__ import annotations

import importlib
import pkgutil

import click

from .. import __version__
from .common import VitGroup
from .options import verbosity_options


@click.group(cls=VitGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="vitdeploy")
@verbosity_options
def main() -> None:
    """Export, verify, quantize, compile and profile Vision Transformer classifiers.

    \b
    The pipeline, on the bundled digits model:
      vitdeploy export -o bundle           # ONNX with preprocessing, labels, spec
      vitdeploy check bundle               # does it compute what PyTorch computes?
      vitdeploy calibrate bundle           # INT8 Q/DQ graph, accuracy measured
      vitdeploy profile bundle             # latency/throughput vs the cost model
      vitdeploy build-engine bundle        # TensorRT engine (on the target GPU)
    """


def _register_commands() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("cmd_"):
            module = importlib.import_module(f"{__name__}.{info.name}")
            main.add_command(module.command)


_register_commands()
