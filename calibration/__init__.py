"""vitdeploy.calibration: INT8 and FP8 for ViTs, decided in the ONNX graph and measured on real data.

* :mod:`.sources` - calibration data (image folder, .npy, digits split) at the graph's input contract;
* :mod:`.settings` - how each target wants its Q/DQ graph (TensorRT, the CPU variant);
* :mod:`.smooth` - SmoothQuant-style activation smoothing of the fp32 graph before quantization;
* :mod:`.qdq` - ORT calibration ranges and Q/DQ insertion on the inputs of MatMul/Gemm/Conv;
* :mod:`.exclusions` - layers kept in float (op types, PyTorch modules, ViT roles);
* :mod:`.inspect` - the placement policy read back from a graph (tests and ``check`` call it);
* :mod:`.cpu_int8` - the CPU-deployment variant (U8S8, 7-bit weights) and CPU feature detection;
* :mod:`.evaluate` - accuracy / agreement in reference (fake-quant) and CPU int8 executions;
* :mod:`.sweep` - methods x exclusion sets, the table and the choice;
* :mod:`.api` - ``calibrate_bundle``, what ``vitdeploy calibrate`` calls;
* :mod:`.fp8` - FP8 (E4M3) Q/DQ for ViTs: activation amax, placement (linear layers, attention), inspection;
* :mod:`.fp8_api` - ``calibrate_fp8_bundle``, what ``vitdeploy calibrate --precision fp8`` calls (gated as INT8);
* :mod:`.fp8_debug` - debug-precision's FP8 trials (a subset of the sites in E4M3, the rest in float);
* :mod:`.legacy_trt` - calibration batches and device memory for TensorRT < 11's entropy calibrator;
* :mod:`.debug_precision` - ``vitdeploy debug-precision``: which parts must stay in higher precision;
* :mod:`.precision_units` - the units debug-precision ranks, and how one trial graph is scored;
* :mod:`.precision_report` - debug-precision's recipe, JSON report, PNG and table;
* :mod:`.recipe_file` - precision recipe files, in the form convert and calibrate take;
* :mod:`.stress_models` - ViTs that fail reduced precision the way real ones do (function-preserving edits).

Importing the package imports neither onnxruntime nor TensorRT; those load inside the functions.
"""
