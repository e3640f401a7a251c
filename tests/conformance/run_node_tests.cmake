# Runs the ONNX node tests when their data is present (scripts/python_env.sh installs it).
if(NOT EXISTS ${NODE_DIR})
  message("ONNX node test data not found at ${NODE_DIR}; run scripts/python_env.sh")
  cmake_language(EXIT 77)
endif()
execute_process(COMMAND ${KILN} conformance ${NODE_DIR} --expected ${EXPECTED} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ONNX node-test conformance regressed (exit ${rc})")
endif()
