/*
 * Stand-ins for TensorRT's native libraries, for TESTS ONLY (never shipped, never installed).
 *
 * TensorRT's Python bindings (tensorrt_bindings/tensorrt.so) link against libnvinfer.so.N,
 * libnvinfer_plugin.so.N and libnvonnxparser.so.N (8.x also libnvparsers.so.8) and reference the
 * C entry points below (found with `nm -D --undefined-only tensorrt.so`). With these stand-ins on
 * LD_LIBRARY_PATH, `import tensorrt` loads the real module of each version: its enums, classes and
 * methods. Every factory returns NULL, which is what the real libnvinfer does when CUDA cannot
 * initialise (no usable GPU): `trt.Builder(logger)` then raises
 * "TypeError: pybind11::init(): factory function returned nullptr", exactly as on a GPU-less host.
 *
 * Build one library per -D flag: LIB_NVINFER, LIB_PLUGIN, LIB_ONNXPARSER, LIB_PARSERS.
 */
#include <stddef.h>

#ifdef LIB_NVINFER
void *createInferBuilder_INTERNAL(void *logger, int version) { (void)logger; (void)version; return NULL; }
void *createInferRuntime_INTERNAL(void *logger, int version) { (void)logger; (void)version; return NULL; }
void *createInferRefitter_INTERNAL(void *engine, void *logger, int version) { (void)engine; (void)logger; (void)version; return NULL; }
void *getPluginRegistry(void) { return NULL; }
void *getBuilderPluginRegistry(int capability) { (void)capability; return NULL; }
#endif

#ifdef LIB_PLUGIN
int initLibNvInferPlugins(void *logger, const char *ns) { (void)logger; (void)ns; return 0; }
#endif

#ifdef LIB_ONNXPARSER
void *createNvOnnxParser_INTERNAL(void *network, void *logger, int version) { (void)network; (void)logger; (void)version; return NULL; }
void *createNvOnnxParserRefitter_INTERNAL(void *refitter, void *logger, int version) { (void)refitter; (void)logger; (void)version; return NULL; }
int getNvOnnxParserVersion(void) { return 0; }
#endif

#ifdef LIB_PARSERS
/* TensorRT 8.x bindings also link the UFF and Caffe parsers (C++ symbols, given by mangled name). */
void *_ZN11nvuffparser15createUffParserEv(void) { return NULL; }
void _ZN11nvuffparser8FieldMapC1EPKcPKvNS_9FieldTypeEi(void *self, const char *name, const void *data, int type, int length) {
    (void)self; (void)name; (void)data; (void)type; (void)length;
}
void *_ZN14nvcaffeparser117createCaffeParserEv(void) { return NULL; }
void _ZN14nvcaffeparser123shutdownProtobufLibraryEv(void) {}
#endif
