"""vitdeploy: take a trained Vision Transformer classifier to NVIDIA GPUs and Jetson.

Importing the package is cheap: torch, onnxruntime and tensorrt are imported only by the functions
that need them (see :mod:`vitdeploy.lazy`).
"""

__version__ = "0.1.0"
