# Helpers that keep each layer's CMakeLists.txt to a few lines.

# kiln_library(NAME SOURCES ... DEPS ... [PRIVATE_DEPS ...] [GENERATED_HEADERS ...]): one static
# library per layer, warnings on, that sees only the headers of the libraries it links.
function(kiln_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PRIVATE_DEPS;GENERATED_HEADERS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  kiln_header_tree(${name} ${ARG_GENERATED_HEADERS})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  kiln_warnings(${name})
endfunction()

# kiln_header_tree(TARGET [GENERATED_HEADER ...]): TARGET's include directory holds only the
# headers of its own folder (not its subfolders, which are other targets), as symbolic links in
# BUILD/include/TARGET/kiln/<folder>/, plus the generated headers named. Consumers reach it through
# target_link_libraries, so a library sees its own headers and those of the libraries it links
# (PUBLIC links transitively), and an #include of a layer it does not link fails to compile, not
# only tools/check_layers.py --targets. The links follow the folder at every configure (a new
# header re-runs CMake through CONFIGURE_DEPENDS); edits to a header need no configure.
function(kiln_header_tree name)
  file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR}/src ${CMAKE_CURRENT_SOURCE_DIR})
  set(root ${PROJECT_BINARY_DIR}/include/${name})
  file(GLOB headers CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.h ${CMAKE_CURRENT_SOURCE_DIR}/*.inc
       ${CMAKE_CURRENT_SOURCE_DIR}/*.cuh)
  file(REMOVE_RECURSE ${root})
  file(MAKE_DIRECTORY ${root}/${rel})
  foreach(h IN LISTS headers ARGN)
    get_filename_component(base ${h} NAME)
    file(CREATE_LINK ${h} ${root}/${rel}/${base} SYMBOLIC)
  endforeach()
  target_include_directories(${name} PUBLIC ${root})
endfunction()

function(kiln_warnings target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
  if(KILN_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
endfunction()

# kiln_use_mimalloc(TARGET): the executable allocates with mimalloc (KILN_MIMALLOC). Linked with
# --no-as-needed so that libmimalloc stays in DT_NEEDED, ahead of libc, and its malloc/free/new
# win symbol resolution for the whole process (shared libraries and dlopen-ed ones included).
function(kiln_use_mimalloc target)
  if(KILN_MIMALLOC AND NOT KILN_BUILD_FUZZ)
    target_link_libraries(${target} PRIVATE -Wl,--no-as-needed mimalloc -Wl,--as-needed)
    target_compile_definitions(${target} PRIVATE KILN_HAVE_MIMALLOC=1)
  endif()
endfunction()

# kiln_test(NAME SOURCES ... DEPS ...): a GoogleTest binary registered with CTest.
function(kiln_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  kiln_warnings(${name})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60
    PROPERTIES TIMEOUT ${ARG_TIMEOUT} LABELS "${ARG_LABELS}"
               ENVIRONMENT "KILN_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
endfunction()

# kiln_cli_link(LIB ...): libraries the `kiln` executable links (a layer calls this for itself).
function(kiln_cli_link)
  set_property(GLOBAL APPEND PROPERTY KILN_CLI_LIBS ${ARGN})
endfunction()

# kiln_embed_file(TARGET FILE SYMBOL): compiles FILE's bytes into TARGET as
# `extern const unsigned char SYMBOL[]; extern const std::size_t SYMBOL_size;`.
function(kiln_embed_file target file symbol)
  set(out ${CMAKE_CURRENT_BINARY_DIR}/embedded_${symbol}.cc)
  add_custom_command(OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -DINPUT=${file} -DOUTPUT=${out} -DSYMBOL=${symbol}
            -P ${PROJECT_SOURCE_DIR}/cmake/EmbedFile.cmake
    DEPENDS ${file} ${PROJECT_SOURCE_DIR}/cmake/EmbedFile.cmake
    COMMENT "Embedding ${file}")
  target_sources(${target} PRIVATE ${out})
endfunction()

# kiln_write_target_graph(FILE): writes, for every library target defined under src/kiln, its
# folder, sources and direct link libraries (PUBLIC, PRIVATE and INTERFACE), one JSON object per
# target. tools/check_layers.py --targets reads it to check that each target's sources include
# only headers of the targets it links (its own included), so an #include of a layer not in DEPS
# fails the check even though every target shares the include directory src/.
function(kiln_write_target_graph file)
  get_property(top DIRECTORY ${PROJECT_SOURCE_DIR} PROPERTY SUBDIRECTORIES)
  set(dirs "")
  foreach(d IN LISTS top)
    if(d MATCHES "^${PROJECT_SOURCE_DIR}/src/kiln/")
      list(APPEND dirs ${d})
    endif()
  endforeach()
  set(entries "")
  while(dirs)
    list(POP_FRONT dirs dir)
    get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
    list(APPEND dirs ${subdirs})
    get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
    foreach(t IN LISTS targets)
      get_target_property(type ${t} TYPE)
      if(NOT type MATCHES "LIBRARY")
        continue()
      endif()
      set(links "")
      foreach(prop LINK_LIBRARIES INTERFACE_LINK_LIBRARIES)
        get_target_property(v ${t} ${prop})
        if(v)
          list(APPEND links ${v})
        endif()
      endforeach()
      set(sources "")
      if(NOT type STREQUAL "INTERFACE_LIBRARY")
        get_target_property(sources ${t} SOURCES)
      endif()
      file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${dir})
      set(json_links "")
      foreach(l IN LISTS links)
        string(REPLACE "\"" "'" l "${l}")
        string(APPEND json_links "\"${l}\",")
      endforeach()
      set(json_sources "")
      foreach(s IN LISTS sources)
        string(APPEND json_sources "\"${s}\",")
      endforeach()
      string(REGEX REPLACE ",$" "" json_links "${json_links}")
      string(REGEX REPLACE ",$" "" json_sources "${json_sources}")
      string(APPEND entries "  \"${t}\": {\"dir\": \"${rel}\", \"type\": \"${type}\", "
             "\"links\": [${json_links}], \"sources\": [${json_sources}]},\n")
    endforeach()
  endwhile()
  string(REGEX REPLACE ",\n$" "\n" entries "${entries}")
  file(WRITE ${file}.tmp "{\n${entries}}\n")
  file(COPY_FILE ${file}.tmp ${file} ONLY_IF_DIFFERENT)
  file(REMOVE ${file}.tmp)
endfunction()
