# Checks that a library's include directories (its own header tree and those of what it links,
# cmake/KilnTargets.cmake's kiln_header_tree) let it include its own and its links' headers and
# hide every other layer's, so an #include across the layer table fails to compile.
# Usage: cmake -DCXX=... -DINCLUDES="a|b|..." -DOWN=kiln/x/y.h -DLINKED=kiln/z/w.h
#              -DHIDDEN="kiln/p/q.h|..." -DWORK=dir -P check_include_tree.cmake
string(REPLACE "|" ";" includes "${INCLUDES}")
string(REPLACE "|" ";" hidden "${HIDDEN}")
set(flags -std=c++20 -fsyntax-only)
foreach(dir IN LISTS includes)
  list(APPEND flags -I${dir})
endforeach()
file(MAKE_DIRECTORY ${WORK})
function(try_include header expect_ok)
  string(MAKE_C_IDENTIFIER "${header}" id)
  set(src ${WORK}/${id}.cc)
  file(WRITE ${src} "#include \"${header}\"\n")
  execute_process(COMMAND ${CXX} ${flags} ${src} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE out)
  if(expect_ok AND NOT rc EQUAL 0)
    message(FATAL_ERROR "#include \"${header}\" should compile with the library's include "
                        "directories and did not:\n${out}")
  endif()
  if(NOT expect_ok)
    if(rc EQUAL 0)
      message(FATAL_ERROR "#include \"${header}\" compiled although the library does not link "
                          "its layer: the header trees leak")
    endif()
    if(NOT out MATCHES "No such file")
      message(FATAL_ERROR "#include \"${header}\" failed for another reason than a missing "
                          "file:\n${out}")
    endif()
  endif()
  message(STATUS "${header}: ${expect_ok} as expected")
endfunction()
try_include(${OWN} TRUE)
try_include(${LINKED} TRUE)
foreach(h IN LISTS hidden)
  try_include(${h} FALSE)
endforeach()
