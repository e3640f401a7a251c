# The structured model fuzzer (model_mutate_fuzz.cc): edits valid zoo models (input dims,
# initializer shapes and int64 values, integer attributes) as its input script says, then runs
# import, shape inference and memory planning. kiln_plan is instrumented here on top of the
# libraries CMakeLists.onnx.cmake instruments, so coverage guides it through the planner too.
# Run: scripts/fuzz.sh 60 model_mutate_fuzz (the zoo models are read from the source tree)
target_compile_options(kiln_plan PRIVATE -fsanitize=fuzzer-no-link,address -fno-omit-frame-pointer -g)
add_executable(model_mutate_fuzz ${CMAKE_CURRENT_LIST_DIR}/model_mutate_fuzz.cc)
target_compile_definitions(model_mutate_fuzz PRIVATE KILN_FUZZ_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
target_compile_options(model_mutate_fuzz PRIVATE -fsanitize=fuzzer,address,undefined -fno-omit-frame-pointer -g)
target_link_options(model_mutate_fuzz PRIVATE -fsanitize=fuzzer,address,undefined)
target_link_libraries(model_mutate_fuzz PRIVATE kiln_onnx kiln_plan)
