// Environment knobs: parsed once; a malformed integer falls back to the default with a warning.
#include "kiln/core/params.h"

#include <charconv>
#include <cstdlib>

#include "kiln/core/logging.h"

namespace kiln::param {

namespace {
std::string EnvOr(const char* env, std::string_view def) {
  const char* v = std::getenv(env);
  return v ? std::string(v) : std::string(def);
}

int64_t EnvIntOr(const char* env, int64_t def) {
  const char* v = std::getenv(env);
  if (!v || !*v) return def;
  int64_t out = 0;
  std::string_view s(v);
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  if (ec != std::errc() || p != s.data() + s.size()) {
    KILN_LOG(Warn, CORE, "KILN-E1008 {}='{}' is not an integer; using the default {}", env, s, def);
    return def;
  }
  return out;
}

constexpr ParamInfo kParams[] = {
#define KILN_PARAM_INT(name, env, def, meaning) {#name, env, #def, meaning},
#define KILN_PARAM_STRING(name, env, def, meaning) {#name, env, def, meaning},
#include "kiln/core/params.inc"
#undef KILN_PARAM_INT
#undef KILN_PARAM_STRING
};
}  // namespace

std::span<const ParamInfo> AllParams() { return kParams; }

#define KILN_PARAM_INT(name, env, def, meaning)  \
  int64_t name() {                               \
    static const int64_t v = EnvIntOr(env, def); \
    return v;                                    \
  }
#define KILN_PARAM_STRING(name, env, def, meaning) \
  const std::string& name() {                      \
    static const std::string v = EnvOr(env, def);  \
    return v;                                      \
  }
#include "kiln/core/params.inc"
#undef KILN_PARAM_INT
#undef KILN_PARAM_STRING

}  // namespace kiln::param
