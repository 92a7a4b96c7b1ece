"""TensorRT engines: build plan, version shims, trtexec line, fingerprint, DLA report, builder.

Nothing here imports TensorRT at import time; ``builder`` and the runtime import it inside functions.

- ``plan``: the build as validated data (precision path, profiles, knobs, DLA settings);
- ``versions``: TensorRT version detection and what each version's API offers;
- ``trtexec``: the equivalent trtexec command line for a version;
- ``fingerprint``: engine.json, checked before an engine is deserialised;
- ``timing_cache``: timing caches keyed by TensorRT version and GPU;
- ``dla``: DLA feasibility report from the ONNX graph alone;
- ``builder``: applies a plan to a live ``tensorrt.Builder``;
- ``service``: `vitdeploy build-engine` as one call.
"""
