"""TensorRT engines: build plan, knobs, version shims, trtexec line, fingerprint, lint and lowering, DLA, builder.

Nothing here imports TensorRT at import time; ``builder`` and the runtime import it inside functions.

- ``plan``: the build as validated data (precision path from ``vitdeploy.precisions``, profiles, DLA settings);
- ``knobs``: each build knob declared once (option, plan record, description, trtexec flag, builder call);
- ``graph_io``: the graph's inputs as a build sees them (names, dtypes, symbolic axes, the image layout);
- ``versions``: TensorRT version detection and what each version's API offers;
- ``trtexec``: the equivalent trtexec command line for a version;
- ``fingerprint``: engine.json, checked before an engine is deserialised;
- ``timing_cache``: timing caches keyed by TensorRT version and GPU;
- ``portable``: weight-stripped plans refitted on the device, version- and hardware-compatible plans;
- ``parser_rules``: what each TensorRT's ONNX parser accepts, as data;
- ``lint``: the nodes a given parser cannot take, with their source;
- ``lowering``: a bundle graph rewritten for TensorRT 8.5/8.6's parser (opset 17), verified with ONNX Runtime;
- ``fp8_target``: whether a target fuses FP8 attention (the plan's note), compute capability parsing;
- ``dla``: DLA feasibility report from the ONNX graph alone;
- ``jetpack``: the JetPack / Jetson Linux / CUDA / TensorRT / module / DLA matrix as data;
- ``targets``: named Jetson targets (``jp6.2-orin-nano``) read from that matrix, and the on-device install check;
- ``builder``: applies a plan to a live ``tensorrt.Builder``;
- ``service``: `vitdeploy build-engine` as one call.
"""
