# Fails when docs/errors.md differs from `kiln errors --markdown` (regenerate it with that command).
execute_process(COMMAND ${KILN} errors --markdown OUTPUT_VARIABLE generated RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kiln errors --markdown failed (${rc})")
endif()
file(READ ${DOC} committed)
if(NOT generated STREQUAL committed)
  message(FATAL_ERROR "docs/errors.md is stale: run `build/tools/kiln/kiln errors --markdown > docs/errors.md`")
endif()
