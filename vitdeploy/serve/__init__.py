"""`vitdeploy serve`: a bundle behind a real Triton Inference Server.

    options.py   ServeOptions: what was asked, validated once, and its command-line round trip
    launcher.py  (main environment) find the serve environment's Python and exec the server in it
    server.py    (serve environment) PyTriton: start tritonserver, bind the model, serve, drain on SIGTERM
    binding.py   the Classifier as a Triton model: tensors as `triton-repo` declares them, the batch callable

The server runs in its own environment (scripts/install_serve_env.sh, `make serve-env`): PyTriton's
Python-backend stub embeds the interpreter and is built for distribution Pythons, and PyTriton
needs numpy < 2; neither constraint reaches the main toolchain. Only light modules are imported
here, so `vitdeploy serve --help` works anywhere.
"""

from __future__ import annotations

from .options import ServeOptions

__all__ = ["ServeOptions"]
