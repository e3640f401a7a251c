# Runs `kiln build` with the precision flags and checks what it prints and writes.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(MODEL ${ZOO}/resnet_tiny/model.onnx)
set(PROFILE input:1x3x64x64,2x3x64x64,4x3x64x64)

function(kiln_builder out_var expect_rc)
  execute_process(COMMAND ${KILN} build ${MODEL} -o ${WORK}/e.kiln --profile ${PROFILE}
                          --deadline 1ms ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL expect_rc)
    message(FATAL_ERROR "kiln build ${ARGN}: exit ${rc} (want ${expect_rc})\n${out}\n${err}")
  endif()
  set(${out_var} "${out}${err}" PARENT_SCOPE)
endfunction()

# The table on stdout.
kiln_builder(out 0 --fp16 --precision-report)
foreach(want "layers per precision: f16" "precision: f16" "graph output keeps its ONNX type")
  string(FIND "${out}" "${want}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "--precision-report table lacks '${want}':\n${out}")
  endif()
endforeach()

# JSON to a file; INT8 with calibration over the zoo's own data sets and a cache.
kiln_builder(out 0 --int8 --calib-dir ${ZOO}/resnet_tiny --calib-method percentile=99.9
           --calib-cache ${WORK}/calib.json --precision-report ${WORK}/precision.json)
file(READ ${WORK}/precision.json json)
string(JSON n LENGTH "${json}" layers)
string(JSON reason GET "${json}" layers 1 reason)
string(JSON casts GET "${json}" casts_inserted)
if(n LESS 5 OR casts LESS 2 OR NOT reason MATCHES "no int8 kernel on cpu|f16|integer")
  message(FATAL_ERROR "precision JSON: ${n} layers, ${casts} casts, reason '${reason}'")
endif()
if(NOT EXISTS ${WORK}/calib.json)
  message(FATAL_ERROR "--calib-cache was not written")
endif()
kiln_builder(out 0 --int8 --calib-dir ${ZOO}/resnet_tiny --calib-method percentile=99.9
           --calib-cache ${WORK}/calib.json)
string(FIND "${out}" "calibration: from cache" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the second build did not reuse the calibration cache:\n${out}")
endif()
# Where the calibration ran (the CPU reference for a CPU build; --calib-on-cpu is accepted).
kiln_builder(out 0 --int8 --calib-dir ${ZOO}/resnet_tiny --calib-on-cpu)
string(FIND "${out}" "on the CPU reference" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the report does not say where the calibration ran:\n${out}")
endif()
# --no-fp8-edges is accepted with --fp8 (a CPU build has no FP8 kernel, hence no edges: the
# report has the count, 0, in its precision JSON).
kiln_builder(out 0 --fp8 --calib-dir ${ZOO}/resnet_tiny --no-fp8-edges
             --precision-report ${WORK}/fp8.json)
file(READ ${WORK}/fp8.json json)
string(JSON edges GET "${json}" fp8_edges)
if(NOT edges EQUAL 0)
  message(FATAL_ERROR "a CPU --fp8 build reports ${edges} FP8 edges")
endif()
# --no-int8-edges likewise with --int8 (INT8 edges need kiln's CUDA INT8 kernel; none on the CPU).
kiln_builder(out 0 --int8 --calib-dir ${ZOO}/resnet_tiny --no-int8-edges
             --precision-report ${WORK}/int8.json)
file(READ ${WORK}/int8.json json)
string(JSON edges GET "${json}" int8_edges)
if(NOT edges EQUAL 0)
  message(FATAL_ERROR "a CPU --int8 build reports ${edges} INT8 edges")
endif()

# Bad method and bad percentile.
kiln_builder(out 1 --int8 --calib-method kl)
string(FIND "${out}" "minmax, entropy or percentile" at)
if(at EQUAL -1)
  message(FATAL_ERROR "--calib-method kl: unexpected message:\n${out}")
endif()
kiln_builder(out 1 --int8 --int8-tolerance 0)
string(FIND "${out}" "--int8-tolerance '0': give the relative L2 error" at)
if(at EQUAL -1)
  message(FATAL_ERROR "--int8-tolerance 0: unexpected message:\n${out}")
endif()
kiln_builder(out 1 --fp8 --fp8-tolerance 0)
string(FIND "${out}" "--fp8-tolerance '0': give the relative L2 error against FP32 that the FP8" at)
if(at EQUAL -1)
  message(FATAL_ERROR "--fp8-tolerance 0: unexpected message:\n${out}")
endif()
# Refused on the command line (KILN-E1016, exit 64, tools/kiln/options.h) before any work.
kiln_builder(out 64 --int8 --calib-method percentile --calib-percentile 0)
string(FIND "${out}" "allowed range (0, 100]" at)
if(at EQUAL -1)
  message(FATAL_ERROR "--calib-percentile 0: unexpected message:\n${out}")
endif()
