// Small helpers shared by the ops' shape rules: attribute reading with kind checks (KILN-E2009)
// and element-wise arithmetic on dims-values. Internal to src/kiln/ops.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kiln/ops/op_schema.h"

namespace kiln::ops_internal {

// Reads an int attribute; a missing one yields `def`, a wrong kind KILN-E2009.
StatusOr<int64_t> IntAttr(const InferenceContext& ctx, const std::string& name, int64_t def);
StatusOr<int64_t> RequiredIntAttr(const InferenceContext& ctx, const std::string& name);
StatusOr<float> FloatAttr(const InferenceContext& ctx, const std::string& name, float def);
StatusOr<std::string> StringAttr(const InferenceContext& ctx, const std::string& name,
                                 const std::string& def);
StatusOr<std::optional<std::vector<int64_t>>> IntsAttr(const InferenceContext& ctx,
                                                       const std::string& name);
// An axis attribute or input normalised against `rank` (KILN-E2009 when out of range).
StatusOr<int64_t> Axis(const InferenceContext& ctx, int64_t axis, int64_t rank);
// Integer values of input i (a constant or a static dims-value); KILN-E2011 when unknown.
StatusOr<std::vector<int64_t>> RequiredInts(const InferenceContext& ctx, size_t i,
                                            const char* what);
// The skip normalisations' common checks: X and Skip (inputs 0 and 1) of one float type and one
// shape, epsilon (default 1e-5) not negative; returns the axis attribute (default -1) normalised.
StatusOr<int64_t> SkipNormAxis(const InferenceContext& ctx);
// Input i is of a float type, and of input 0's type when i > 0 (KILN-E2007 otherwise).
Status RequireFloat(const InferenceContext& ctx, size_t i);
// Whether two dims are known equal / known different (dims are sizes, so never negative).
std::optional<bool> DimsEqual(const Dim& a, const Dim& b);

}  // namespace kiln::ops_internal
