// The doctor's data files, embedded into the library at build time (embed_data.cmake) so that a
// bundled `kiln` needs no data directory on the GPU machine.
#pragma once

#include <string_view>

namespace kiln::doctor::embedded {
std::string_view Signatures();     // data/doctor/signatures.json
std::string_view KnownProblems();  // data/doctor/known_problems.json
}  // namespace kiln::doctor::embedded
