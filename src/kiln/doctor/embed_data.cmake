# Writes a C++ file holding data/doctor/*.json as byte arrays (run by CMake at build time).
# -DSIGNATURES=... -DKNOWN=... -DOUT=...
function(kiln_embed var file out_var)
  file(READ ${file} hex HEX)
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," hex "${hex}")
  set(${out_var} "const unsigned char ${var}[] = {${hex}0x00};\n" PARENT_SCOPE)
endfunction()
kiln_embed(kSignatures ${SIGNATURES} a)
kiln_embed(kKnown ${KNOWN} b)
file(WRITE ${OUT}.tmp "// Generated from data/doctor by embed_data.cmake; do not edit.\n#include \"kiln/doctor/embedded_data.h\"\nnamespace kiln::doctor::embedded {\nnamespace {\n${a}${b}}\nstd::string_view Signatures() { return {reinterpret_cast<const char*>(kSignatures), sizeof(kSignatures) - 1}; }\nstd::string_view KnownProblems() { return {reinterpret_cast<const char*>(kKnown), sizeof(kKnown) - 1}; }\n}  // namespace kiln::doctor::embedded\n")
file(COPY_FILE ${OUT}.tmp ${OUT} ONLY_IF_DIFFERENT)
