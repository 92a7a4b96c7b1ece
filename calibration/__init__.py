"""vitdeploy.calibration: INT8 for ViTs, decided in the ONNX graph and measured on real data.

* :mod:`.sources` - calibration data (image folder, .npy, digits split) at the graph's input contract;
* :mod:`.qdq` - ORT calibration ranges and Q/DQ insertion on the inputs of MatMul/Gemm/Conv;
* :mod:`.exclusions` - layers kept in float (op types, PyTorch modules, ViT roles);
* :mod:`.inspect` - the placement policy read back from a graph (tests and ``check`` call it);
* :mod:`.cpu_int8` - the CPU-deployment variant (U8S8, 7-bit weights) and CPU feature detection;
* :mod:`.evaluate` - accuracy / agreement in reference (fake-quant) and CPU int8 executions;
* :mod:`.sweep` - methods x exclusion sets, the table and the choice;
* :mod:`.api` - ``calibrate_bundle``, what ``vitdeploy calibrate`` calls;
* :mod:`.legacy_trt` - calibration batches and device memory for TensorRT < 11's entropy calibrator.

Importing the package imports neither onnxruntime nor TensorRT; those load inside the functions.
"""
