# Runs the ONNX node tests when their data is present (scripts/python_env.sh installs it).
if(NOT EXISTS ${NODE_DIR})
  # A skip (the test's SKIP_REGULAR_EXPRESSION matches this line); cmake_language(EXIT) needs
  # CMake 3.29 and Debian 12 has 3.25.
  message("ONNX node test data not found at ${NODE_DIR}; run scripts/python_env.sh")
  return()
endif()
execute_process(COMMAND ${KILN} conformance ${NODE_DIR} --expected ${EXPECTED} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ONNX node-test conformance regressed (exit ${rc})")
endif()
