// Typed accessors for kiln's environment knobs (params.inc). Values are read once, on first use.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace kiln::param {

struct ParamInfo {
  std::string_view name;
  std::string_view env;
  std::string_view default_value;
  std::string_view meaning;
};

std::span<const ParamInfo> AllParams();

#define KILN_PARAM_INT(name, env, def, meaning) int64_t name();
#define KILN_PARAM_STRING(name, env, def, meaning) const std::string& name();
#include "kiln/core/params.inc"
#undef KILN_PARAM_INT
#undef KILN_PARAM_STRING

}  // namespace kiln::param
