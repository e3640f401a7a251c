# `kiln build --distributed --transport nccl` in a kiln built with NCCL reaches the NCCL transport:
# on a machine with a GPU it builds (world size 1), on one without it fails with the transport's
# own "no CUDA device" error, never with "built without NCCL" (KILN-E7015), which the CLI gave
# before it passed the NCCL factory to build-once.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
execute_process(
  COMMAND ${CMAKE_COMMAND} -E env --unset=OMPI_COMM_WORLD_SIZE --unset=OMPI_COMM_WORLD_RANK
          RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1
          ${KILN} --log-level WARN build ${MODEL} -o ${WORK}/engine.kiln
          --profile input:1x3x64x64,2x3x64x64,4x3x64x64 --distributed --transport nccl
          --join-timeout 30 --dist-report ${WORK}/report.json
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
if(rc EQUAL 0)
  file(READ ${WORK}/report.json report)
  if(NOT report MATCHES "\"transport\": \"nccl\"")
    message(FATAL_ERROR "built, but the report does not name the NCCL transport: ${report}")
  endif()
  message(STATUS "built through NCCL: ${report}")
elseif("${out}${err}" MATCHES "KILN-E7015")
  message(FATAL_ERROR "the CLI says NCCL is unavailable in a kiln built with it: ${out}${err}")
elseif(NOT "${out}${err}" MATCHES "no CUDA device for the NCCL transport")
  message(FATAL_ERROR "unexpected failure (rc ${rc}): ${out}${err}")
else()
  message(STATUS "no GPU here; the NCCL transport was reached: ${err}")
endif()
