# The engine-loader fuzzer; fuzz/CMakeLists.txt includes this file when KILN_BUILD_FUZZ is on
# (configure with the "fuzz" preset: clang). The loader itself is compiled into the target with
# coverage and sanitizers, and so is the runtime that runs what it accepts; everything below them
# links uninstrumented.
# Seeds: `KILN_ENGINE_SEED_DIR=DIR engine_tests --gtest_filter=*FuzzSeeds*` writes small engines.
# Run: build-fuzz/fuzz/engine_load_fuzz -max_total_time=60 CORPUS_DIR SEED_DIR
if(KILN_BUILD_FUZZ AND CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  add_executable(engine_load_fuzz
    ${CMAKE_CURRENT_LIST_DIR}/engine_load_fuzz.cc
    ${PROJECT_SOURCE_DIR}/src/kiln/engine/engine_file.cc
    ${PROJECT_SOURCE_DIR}/src/kiln/engine/engine_plan.cc
    ${PROJECT_SOURCE_DIR}/src/kiln/runtime/engine.cc
    ${PROJECT_SOURCE_DIR}/src/kiln/runtime/execution_context.cc
    ${PROJECT_SOURCE_DIR}/tests/engine/test_kernels.cc)
  add_dependencies(engine_load_fuzz kiln_engine)  # generates engine_generated.h
  target_include_directories(engine_load_fuzz PRIVATE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/src
                             ${PROJECT_BINARY_DIR}/src)
  target_compile_definitions(engine_load_fuzz PRIVATE KILN_VERSION_STRING="${PROJECT_VERSION}")
  target_compile_options(engine_load_fuzz PRIVATE -fsanitize=fuzzer,address,undefined -g)
  target_link_options(engine_load_fuzz PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(engine_load_fuzz PRIVATE kiln_backend_cpu kiln_plan kiln_ops
                        flatbuffers::flatbuffers)
endif()
