# The ONNX-loader fuzzer (onnx_load_fuzz.cc): ImportOnnxBytes on arbitrary bytes. The libraries
# it drives (core, ir, ops, onnx) are compiled with coverage and ASan in the fuzz build so that
# coverage guides the fuzzer through them; protobuf itself links uninstrumented.
# Run: scripts/fuzz.sh 60 onnx_load_fuzz
foreach(lib kiln_core kiln_ir kiln_ops kiln_onnx)
  target_compile_options(${lib} PRIVATE -fsanitize=fuzzer-no-link,address -fno-omit-frame-pointer -g)
endforeach()
add_executable(onnx_load_fuzz ${CMAKE_CURRENT_LIST_DIR}/onnx_load_fuzz.cc)
target_compile_options(onnx_load_fuzz PRIVATE -fsanitize=fuzzer,address -fno-omit-frame-pointer -g)
target_link_options(onnx_load_fuzz PRIVATE -fsanitize=fuzzer,address)
target_link_libraries(onnx_load_fuzz PRIVATE kiln_onnx)
