# Turns a file into a C++ source holding its bytes (cmake -P mode).
# Inputs: INPUT (file), OUTPUT (.cc), SYMBOL (C++ identifier).
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" hex_len)
math(EXPR size "${hex_len} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
file(WRITE "${OUTPUT}" "// Generated from ${INPUT} by cmake/EmbedFile.cmake. Do not edit.\n#include <cstddef>\n#include <cstdint>\nalignas(64) extern const unsigned char ${SYMBOL}[] = {\n${bytes}0};\nextern const std::size_t ${SYMBOL}_size = ${size};\n")
