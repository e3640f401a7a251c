// Op conformance cases, tensor family: Resize (linear, nearest, cubic), data movement and
// shape ops (Transpose, Slice, Gather, Concat, Split, Expand, Shape, Trilu, ...), Pad, Tile,
// DepthToSpace/SpaceToDepth, GatherElements, GatherND, ScatterElements, ScatterND, OneHot, Range.
// Each case is a one-node graph that the suite (op_conformance_test.cc) runs on every backend built
// here, every tactic, on fresh random inputs, against the CPU backend or the case's reference (see
// op_cases.h).
#include <algorithm>

#include "op_cases.h"

namespace kiln::testing {
namespace {

// The coordinates of element i of a row-major tensor of `dims`.
std::vector<int64_t> Coords(int64_t i, const std::vector<int64_t>& dims) {
  std::vector<int64_t> c(dims.size());
  for (size_t a = dims.size(); a-- > 0;) {
    c[a] = i % dims[a];
    i /= dims[a];
  }
  return c;
}

int64_t Offset(const std::vector<int64_t>& coords, const std::vector<int64_t>& strides) {
  int64_t off = 0;
  for (size_t a = 0; a < coords.size(); ++a) off += coords[a] * strides[a];
  return off;
}

// GatherND (ONNX spec, per output element): out[i..., s...] = data[i[:b]..., tuple(i)..., s...].
ReferenceFn GatherNdRef(int64_t b) {
  return [b](const std::vector<RefTensor>& in) {
    const RefTensor &data = in[0], &ind = in[1];
    int64_t q = static_cast<int64_t>(ind.dims.size()), k = ind.dims.back();
    std::vector<int64_t> dims(ind.dims.begin(), ind.dims.end() - 1);
    dims.insert(dims.end(), data.dims.begin() + b + k, data.dims.end());
    RefTensor out = RefTensor::Zeros(dims);
    for (int64_t o = 0; o < out.size(); ++o) {
      std::vector<int64_t> c = Coords(o, dims);
      std::vector<int64_t> ic(c.begin(), c.begin() + q - 1), at(c.begin(), c.begin() + b);
      ic.push_back(0);
      for (int64_t d = 0; d < k; ++d) {
        ic.back() = d;
        int64_t j = static_cast<int64_t>(ind[Offset(ic, ind.Strides())]);
        at.push_back(j < 0 ? j + data.dims[b + d] : j);
      }
      at.insert(at.end(), c.begin() + q - 1, c.end());
      out[o] = data[Offset(at, data.Strides())];
    }
    return std::vector<RefTensor>{out};
  };
}

// `o` combined with `u` by a scatter reduction ("none": replaced).
double Reduce(const std::string& red, double o, double u) {
  return red == "add"   ? o + u
         : red == "mul" ? o * u
         : red == "max" ? std::max(o, u)
         : red == "min" ? std::min(o, u)
                        : u;
}

// ScatterElements: update t goes to data's element at t's coordinates with the axis one replaced
// by indices[t], in index order.
ReferenceFn ScatterElementsRef(int64_t axis, std::string red) {
  return [axis, red](const std::vector<RefTensor>& in) {
    const RefTensor &data = in[0], &ind = in[1], &upd = in[2];
    RefTensor out = data;
    int64_t a = axis < 0 ? axis + static_cast<int64_t>(data.dims.size()) : axis;
    for (int64_t t = 0; t < ind.size(); ++t) {
      std::vector<int64_t> c = Coords(t, ind.dims);
      int64_t j = static_cast<int64_t>(ind[t]);
      c[a] = j < 0 ? j + data.dims[a] : j;
      double& o = out[Offset(c, data.Strides())];
      o = Reduce(red, o, upd[t]);
    }
    return std::vector<RefTensor>{out};
  };
}

// ScatterND: index tuple t (k entries) picks a slice of data; update slice t combines into it.
ReferenceFn ScatterNdRef(std::string red) {
  return [red](const std::vector<RefTensor>& in) {
    const RefTensor &data = in[0], &ind = in[1], &upd = in[2];
    RefTensor out = data;
    int64_t k = ind.dims.back(), tuples = ind.size() / k, slice = data.size();
    for (int64_t d = 0; d < k; ++d) slice /= data.dims[d];
    for (int64_t t = 0; t < tuples; ++t) {
      std::vector<int64_t> at;
      for (int64_t d = 0; d < k; ++d) {
        int64_t j = static_cast<int64_t>(ind[t * k + d]);
        at.push_back(j < 0 ? j + data.dims[d] : j);
      }
      at.resize(data.dims.size(), 0);
      int64_t base = Offset(at, data.Strides());
      for (int64_t e = 0; e < slice; ++e) {
        out[base + e] = Reduce(red, out[base + e], upd[t * slice + e]);
      }
    }
    return std::vector<RefTensor>{out};
  };
}

// ConcatSlices: along `axis`, the range [starts[i], starts[i] + lengths[i]) of each input.
ReferenceFn ConcatSlicesRef(int64_t axis, std::vector<int64_t> starts,
                            std::vector<int64_t> lengths) {
  return [=](const std::vector<RefTensor>& in) {
    std::vector<int64_t> dims = in[0].dims;
    int64_t total = 0;
    for (int64_t n : lengths) total += n;
    dims[static_cast<size_t>(axis)] = total;
    RefTensor out = RefTensor::Zeros(dims);
    for (int64_t o = 0; o < out.size(); ++o) {
      std::vector<int64_t> c = Coords(o, dims);
      int64_t k = c[static_cast<size_t>(axis)];
      size_t p = 0;
      while (k >= lengths[p]) k -= lengths[p++];
      c[static_cast<size_t>(axis)] = starts[p] + k;
      out[o] = in[p][Offset(c, in[p].Strides())];
    }
    return std::vector<RefTensor>{out};
  };
}

}  // namespace

std::vector<OpCase> TensorCases() {
  std::vector<OpCase> c;
  // `add`: a case each backend runs where it has a tactic; `must`: every backend must have one.
  [[maybe_unused]] auto add = [&c](std::string name, std::function<OpTester()> make) {
    c.push_back({std::move(name), std::move(make), false});
  };
  [[maybe_unused]] auto must = [&c](std::string name, std::function<OpTester()> make) {
    c.push_back({std::move(name), std::move(make), true});
  };

  // ---- Resize -----------------------------------------------------------------------------------
  struct Rz {
    const char* mode;
    const char* coord;
    const char* nearest;
    std::vector<int64_t> x, sizes;
  };
  for (Rz z : std::vector<Rz>{
           {"nearest", "asymmetric", "floor", {1, 2, 5, 7}, {1, 2, 10, 14}},
           {"nearest", "half_pixel", "round_prefer_floor", {2, 3, 7, 9}, {2, 3, 3, 4}},
           {"linear", "half_pixel", "round_prefer_floor", {1, 3, 6, 5}, {1, 3, 12, 10}},
           {"linear", "align_corners", "round_prefer_floor", {2, 2, 4, 9}, {2, 2, 7, 5}},
           {"linear", "pytorch_half_pixel", "round_prefer_floor", {1, 1, 9, 1}, {1, 1, 4, 1}}}) {
    std::string name = std::string("Resize_") + z.mode + "_" + z.coord + "_" +
                       std::to_string(z.sizes[2]) + "x" + std::to_string(z.sizes[3]);
    add(name, [z] {
      OpTester t("Resize", Attrs({{"mode", std::string(z.mode)},
                                  {"coordinate_transformation_mode", std::string(z.coord)},
                                  {"nearest_mode", std::string(z.nearest)}}));
      t.Input(kF32, z.x).Omitted().Omitted().Constant(I64({4}, z.sizes));
      t.FloatTypes(kAllFloats).Tolerance(1e-5, 1e-4);
      return t;
    });
  }
  add("Resize_scales_nearest_2x", [] {
    OpTester t("Resize", Attrs({{"mode", std::string("nearest")}}));
    t.Input(kF32, {1, 4, 3, 5}).Omitted().Constant(F32({4}, {1.f, 1.f, 2.f, 2.f}));
    return t;
  });

  // ---- data movement ----------------------------------------------------------------------------
  add("Gather_axis0_neg", [] {
    OpTester t("Gather", Attrs({{"axis", int64_t{0}}}));
    t.Input(kF32, {5, 7}).Input(I64({3}, {0, -1, 3})).FloatTypes(kAllFloats);
    return t;
  });
  add("Gather_axis1_i32", [] {
    OpTester t("Gather", Attrs({{"axis", int64_t{1}}}));
    t.Input(kF32, {3, 6, 4})
        .Input(Tensor::FromVector(kI32, {2, 2}, std::vector<int32_t>{5, 0, 2, 2}));
    t.FloatTypes(kAllFloats);
    return t;
  });
  add("Gather_embedding", [] {
    OpTester t("Gather", Attrs({{"axis", int64_t{0}}}));
    t.Input(kF32, {100, 64}).Input(I64({2, 5}, {1, 99, 3, 0, 42, 7, 7, 8, 50, 61}));
    t.FloatTypes(kAllFloats);
    return t;
  });
  add("Gather_shape_scalar", [] {
    OpTester t("Gather", Attrs({{"axis", int64_t{0}}}));
    t.Input(I64({4}, {2, 3, 5, 7})).Input(I64({}, {2}));
    return t;
  });
  add("Concat_axis1_3parts", [] {
    OpTester t("Concat", Attrs({{"axis", int64_t{1}}}));
    t.Input(kF32, {2, 3, 5}).Input(kF32, {2, 1, 5}).Input(kF32, {2, 4, 5}).FloatTypes(kAllFloats);
    return t;
  });
  add("Concat_axis0", [] {
    OpTester t("Concat", Attrs({{"axis", int64_t{0}}}));
    t.Input(kF32, {1, 64}).Input(kF32, {3, 64}).FloatTypes(kAllFloats);
    return t;
  });
  add("Concat_last_odd", [] {
    OpTester t("Concat", Attrs({{"axis", int64_t{-1}}}));
    t.Input(kF32, {3, 3}).Input(kF32, {3, 5}).Input(kF32, {3, 1}).FloatTypes(kAllFloats);
    return t;
  });
  add("Concat_i64_shapes", [] {
    OpTester t("Concat", Attrs({{"axis", int64_t{0}}}));
    t.Input(I64({1}, {4})).Input(I64({1}, {-1})).Input(I64({2}, {8, 16}));
    return t;
  });
  // ConcatSlices (slice_concat_fusion): a roll's two ranges of axis 1, ranges of two inputs
  // and a whole one on the last axis with an odd row (2-byte units), an empty range.
  must("ConcatSlices_roll_axis1", [] {
    std::vector<int64_t> st = {3, 0}, len = {4, 3};
    OpTester t("ConcatSlices", Attrs({{"axis", int64_t{1}}, {"starts", st}, {"lengths", len}}));
    t.Input(kF32, {2, 7, 6, 8}).Input(kF32, {2, 7, 6, 8}).FloatTypes(kAllFloats);
    t.Reference(ConcatSlicesRef(1, st, len));
    return t;
  });
  must("ConcatSlices_last_axis_mixed", [] {
    std::vector<int64_t> st = {2, 0, 0, 1}, len = {3, 5, 0, 1};
    OpTester t("ConcatSlices", Attrs({{"axis", int64_t{-1}}, {"starts", st}, {"lengths", len}}));
    t.Input(kF32, {3, 2, 5}).Input(kF32, {3, 2, 5}).Input(kF32, {3, 2, 4}).Input(kF32, {3, 2, 3});
    t.FloatTypes(kAllFloats);
    t.Reference(ConcatSlicesRef(2, st, len));
    return t;
  });
  add("Split_equal", [] {
    OpTester t("Split", Attrs({{"axis", int64_t{0}}, {"num_outputs", int64_t{3}}}));
    t.Input(kF32, {6, 5}).Outputs(3).FloatTypes(kAllFloats);
    return t;
  });
  add("Split_sizes_last", [] {
    OpTester t("Split", Attrs({{"axis", int64_t{-1}}}));
    t.Input(kF32, {2, 3, 12}).Constant(I64({3}, {4, 4, 4})).Outputs(3).FloatTypes(kAllFloats);
    return t;
  });
  add("Slice_const_steps", [] {
    OpTester t("Slice");
    t.Input(kF32, {10, 12}).Constant(I64({2}, {1, -4})).Constant(I64({2}, {8, 100}));
    t.Constant(I64({2}, {0, 1})).Constant(I64({2}, {2, 1})).FloatTypes(kAllFloats);
    return t;
  });
  add("Slice_negative_step", [] {
    OpTester t("Slice");
    t.Input(kF32, {4, 9}).Constant(I64({1}, {-1})).Constant(I64({1}, {-100}));
    t.Constant(I64({1}, {1})).Constant(I64({1}, {-2})).FloatTypes(kAllFloats);
    return t;
  });
  add("Slice_no_axes", [] {
    OpTester t("Slice");
    t.Input(kF32, {5, 6, 7}).Constant(I64({2}, {1, 2})).Constant(I64({2}, {4, 5}));
    t.FloatTypes(kAllFloats);
    return t;
  });
  for (std::pair<std::vector<int64_t>, std::vector<int64_t>> p :
       std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
           {{2, 3, 4, 5}, {0, 2, 1, 3}},
           {{7, 9}, {}},
           {{2, 3, 4}, {2, 0, 1}},
           {{64, 33, 65}, {2, 1, 0}},
           {{2, 16, 4, 32}, {0, 2, 1, 3}},
           {{2, 24, 7, 9}, {0, 2, 3, 1}},
           {{3, 9, 5, 40}, {0, 3, 1, 2}}}) {
    add("Transpose_" + std::to_string(NumElements(p.first)), [p] {
      AttributeMap at;
      if (!p.second.empty()) at.Set("perm", p.second);
      OpTester t("Transpose", at);
      t.Input(kF32, p.first).FloatTypes(kAllFloats);
      return t;
    });
  }
  add("Transpose_i64", [] {
    OpTester t("Transpose", Attrs({{"perm", std::vector<int64_t>{1, 0}}}));
    t.Input(kI64, {3, 5}, -9, 9);
    return t;
  });
  add("Expand", [] {
    OpTester t("Expand");
    t.Input(kF32, {3, 1}).Constant(I64({3}, {2, 3, 4})).FloatTypes(kAllFloats);
    return t;
  });
  add("Reshape", [] {
    OpTester t("Reshape");
    t.Input(kF32, {2, 3, 4}).Constant(I64({2}, {6, 4})).FloatTypes(kAllFloats);
    return t;
  });
  add("Flatten", [] {
    OpTester t("Flatten", Attrs({{"axis", int64_t{1}}}));
    t.Input(kF32, {2, 3, 4}).FloatTypes(kAllFloats);
    return t;
  });
  add("Squeeze", [] {
    OpTester t("Squeeze");
    t.Input(kF32, {1, 3, 1, 5}).Constant(I64({2}, {0, 2}));
    return t;
  });
  add("Unsqueeze", [] {
    OpTester t("Unsqueeze");
    t.Input(kI64, {3}, -5, 5).Constant(I64({1}, {0}));
    return t;
  });
  add("Identity", [] {
    OpTester t("Identity");
    t.Input(kF32, {17}).FloatTypes(kAllFloats);
    return t;
  });
  add("Trilu_upper", [] {
    OpTester t("Trilu");
    t.Input(kF32, {2, 5, 6}).FloatTypes(kAllFloats);
    return t;
  });
  add("Trilu_lower_k", [] {
    OpTester t("Trilu", Attrs({{"upper", int64_t{0}}}));
    t.Input(kF32, {7, 4}).Constant(I64({}, {1}));
    return t;
  });
  add("Shape", [] {
    OpTester t("Shape");
    t.Input(kF32, {2, 3, 5});
    return t;
  });
  add("Shape_start", [] {
    OpTester t("Shape", Attrs({{"start", int64_t{1}}}));
    t.Input(kF32, {2, 3, 5, 7});
    return t;
  });
  add("ConstantOfShape", [] {
    OpTester t("ConstantOfShape", Attrs({{"value", F32({1}, {1.5f})}}));
    t.Constant(I64({2}, {3, 4}));
    return t;
  });
  add("ConstantOfShape_i64", [] {
    OpTester t("ConstantOfShape", Attrs({{"value", I64({1}, {1})}}));
    t.Constant(I64({1}, {5}));
    return t;
  });
  add("Range_f32", [] {
    OpTester t("Range");
    t.Constant(F32({}, {1.f})).Constant(F32({}, {10.f})).Constant(F32({}, {1.5f}));
    return t;
  });
  add("Range_i64", [] {
    OpTester t("Range");
    t.Constant(I64({}, {0})).Constant(I64({}, {128})).Constant(I64({}, {1}));
    return t;
  });

  // ---- Pad -------------------------------------------------------------------------------------
  struct P {
    std::string mode;
    std::vector<int64_t> dims, pads;
  };
  for (const P& p : std::vector<P>{{"constant", {2, 3, 4}, {0, 1, 2, 1, 0, 3}},
                                   {"edge", {2, 3, 4}, {1, 2, 0, 0, 3, 2}},
                                   {"reflect", {3, 5}, {2, 3, 2, 4}},
                                   {"wrap", {3, 5}, {2, 6, 1, 7}},
                                   {"constant", {4, 6}, {-1, 2, 1, -2}},
                                   {"reflect", {1, 1, 6, 7}, {0, 0, 2, 3, 0, 0, 3, 2}}}) {
    std::string name = "Pad_" + p.mode + "_" + std::to_string(NumElements(p.dims)) + "_" +
                       std::to_string(p.pads[0]) + std::to_string(p.pads.back());
    must(name, [p] {
      OpTester t("Pad", Attrs({{"mode", p.mode}}));
      t.Input(kF32, p.dims).Constant(I64({static_cast<int64_t>(p.pads.size())}, p.pads));
      t.FloatTypes(kAllFloats);
      return t;
    });
  }
  must("Pad_constant_value", [] {
    OpTester t("Pad");
    t.Input(kF32, {3, 4}).Constant(I64({4}, {1, 2, 2, 1})).Constant(F32({}, {-7.5f}));
    t.FloatTypes(kAllFloats);
    return t;
  });
  must("Pad_constant_value_runtime", [] {
    OpTester t("Pad");
    t.Input(kF32, {3, 4}).Constant(I64({4}, {0, 1, 3, 0})).Input(F32({}, {2.25f}));
    t.FloatTypes(kAllFloats);
    return t;
  });
  must("Pad_axes", [] {
    OpTester t("Pad", Attrs({{"mode", std::string("edge")}}));
    t.Input(kF32, {2, 3, 4})
        .Constant(I64({2}, {1, 2}))
        .Omitted()
        .Constant(I64({1}, {-1}))
        .FloatTypes(kAllFloats);
    return t;
  });
  must("Pad_i64", [] {
    OpTester t("Pad", Attrs({{"mode", std::string("reflect")}}));
    t.Input(kI64, {4, 5}, -100, 100).Constant(I64({4}, {3, 1, 0, 4}));
    return t;
  });
  must("Pad_bool", [] {
    OpTester t("Pad");
    t.Input(kBool, {3, 3}).Constant(I64({4}, {1, 1, 1, 1}));
    return t;
  });

  // ---- Tile ------------------------------------------------------------------------------------
  must("Tile_3d", [] {
    OpTester t("Tile");
    t.Input(kF32, {2, 3, 4}).Constant(I64({3}, {2, 1, 3})).FloatTypes(kAllFloats);
    return t;
  });
  must("Tile_1d", [] {
    OpTester t("Tile");
    t.Input(kF32, {7}).Constant(I64({1}, {5})).FloatTypes(kAllFloats);
    return t;
  });
  must("Tile_i64", [] {
    OpTester t("Tile");
    t.Input(kI64, {3, 1, 2}, -9, 9).Constant(I64({3}, {1, 4, 2}));
    return t;
  });
  must("Tile_bool", [] {
    OpTester t("Tile");
    t.Input(kBool, {2, 3}).Constant(I64({2}, {3, 2}));
    return t;
  });

  // ---- DepthToSpace / SpaceToDepth -------------------------------------------------------------
  for (const char* mode : {"DCR", "CRD"}) {
    std::string m = mode;
    must("DepthToSpace_" + m, [m] {
      OpTester t("DepthToSpace", Attrs({{"blocksize", int64_t{2}}, {"mode", m}}));
      t.Input(kF32, {2, 8, 3, 5}).FloatTypes(kAllFloats);
      return t;
    });
    must("DepthToSpace_" + m + "_b3", [m] {
      OpTester t("DepthToSpace", Attrs({{"blocksize", int64_t{3}}, {"mode", m}}));
      t.Input(kF32, {1, 18, 4, 4}).FloatTypes(kAllFloats);
      return t;
    });
  }
  must("SpaceToDepth", [] {
    OpTester t("SpaceToDepth", Attrs({{"blocksize", int64_t{2}}}));
    t.Input(kF32, {2, 3, 4, 6}).FloatTypes(kAllFloats);
    return t;
  });
  must("SpaceToDepth_i64_b3", [] {
    OpTester t("SpaceToDepth", Attrs({{"blocksize", int64_t{3}}}));
    t.Input(kI64, {1, 2, 6, 9}, -99, 99);
    return t;
  });

  // ---- GatherElements --------------------------------------------------------------------------
  must("GatherElements_axis1", [] {
    OpTester t("GatherElements", Attrs({{"axis", int64_t{1}}}));
    t.Input(kF32, {4, 5}).Input(kI64, {4, 3}, -5, 4).FloatTypes(kAllFloats);
    return t;
  });
  must("GatherElements_axis0_3d", [] {
    OpTester t("GatherElements", Attrs({{"axis", int64_t{0}}}));
    t.Input(kF32, {3, 4, 5}).Input(kI64, {6, 4, 2}, -3, 2).FloatTypes(kAllFloats);
    return t;
  });
  must("GatherElements_neg_axis_i32", [] {
    OpTester t("GatherElements", Attrs({{"axis", int64_t{-1}}}));
    t.Input(kI64, {2, 3, 7}, -50, 50).Input(kI32, {2, 3, 9}, -7, 6);
    return t;
  });
  must("GatherElements_constant_indices", [] {
    OpTester t("GatherElements", Attrs({{"axis", int64_t{1}}}));
    t.Input(kF32, {2, 3}).Constant(I64({2, 2}, {0, 2, -1, 1})).FloatTypes(kAllFloats);
    return t;
  });

  // ---- ScatterND -------------------------------------------------------------------------------
  must("ScatterND_rows", [] {
    OpTester t("ScatterND");
    std::vector<int64_t> rows = Shuffled(6, 3);
    t.Input(kF32, {6, 5, 4})
        .Input(I64({3, 1}, {rows[0], rows[1] - 6, rows[2]}))  // one negative index
        .Input(kF32, {3, 5, 4})
        .FloatTypes(kAllFloats);
    return t;
  });
  must("ScatterND_elements", [] {
    OpTester t("ScatterND");
    // Distinct (row, col) pairs of a 7x8 matrix.
    std::vector<int64_t> cells = Shuffled(56, 9), idx;
    for (int i = 0; i < 10; ++i) {
      idx.push_back(cells[i] / 8);
      idx.push_back(cells[i] % 8);
    }
    t.Input(kF32, {7, 8}).Input(I64({10, 2}, idx)).Input(kF32, {10}).FloatTypes(kAllFloats);
    return t;
  });
  must("ScatterND_i32_indices_bool", [] {
    OpTester t("ScatterND");
    t.Input(kBool, {4, 3}).Input(I32({2, 1}, {3, 0})).Input(kBool, {2, 3});
    return t;
  });
  for (const char* red : {"add", "mul", "max", "min"}) {
    std::string r = red;
    // Duplicate indices on purpose: the reductions combine them.
    must("ScatterND_" + r + "_i64", [r] {
      OpTester t("ScatterND", Attrs({{"reduction", r}}));
      t.Input(kI64, {5, 4}, -9, 9)
          .Input(I64({6, 1}, {1, 3, 1, 0, 3, 1}))
          .Input(kI64, {6, 4}, -9, 9);
      return t;
    });
    must("ScatterND_" + r + "_f32", [r] {
      OpTester t("ScatterND", Attrs({{"reduction", r}}));
      t.Input(kF32, {5, 4}).Input(I64({6, 1}, {1, 3, 1, 0, 3, 1})).Input(kF32, {6, 4});
      t.Tolerance(1e-5, 1e-5);  // atomics add in any order
      return t;
    });
  }

  // Reductions in the types only the CPU has so far (`add` cases, against the reference).
  add("ScatterND_max_all_floats", [] {
    OpTester t("ScatterND", Attrs({{"reduction", std::string("max")}}));
    t.Input(kF32, {5, 4}).Input(I64({6, 1}, {1, 3, 1, 0, -2, 1})).Input(kF32, {6, 4});
    t.FloatTypes(kAllFloats);
    t.Reference(ScatterNdRef("max"));
    return t;
  });
  add("ScatterND_add_f16_bf16", [] {
    OpTester t("ScatterND", Attrs({{"reduction", std::string("add")}}));
    t.Input(kF32, {4, 3}).Input(I64({3, 2}, {1, 2, 1, 2, -4, 0})).Input(kF32, {3});
    t.FloatTypes({DataType::kFloat16, DataType::kBFloat16});
    t.Reference(ScatterNdRef("add"));
    return t;
  });
  add("ScatterND_mul_i8", [] {
    OpTester t("ScatterND", Attrs({{"reduction", std::string("mul")}}));
    t.Input(DataType::kInt8, {3, 2, 2}, -3, 3)
        .Input(I64({2, 2}, {2, 1, 2, -1}))
        .Input(DataType::kInt8, {2, 2}, -3, 3);
    t.Reference(ScatterNdRef("mul"));
    return t;
  });
  add("ScatterND_min_u8", [] {
    OpTester t("ScatterND", Attrs({{"reduction", std::string("min")}}));
    t.Input(DataType::kUInt8, {4, 3}, 0, 255)
        .Input(I32({3, 1}, {0, 3, 0}))
        .Input(DataType::kUInt8, {3, 3}, 0, 255);
    t.Reference(ScatterNdRef("min"));
    return t;
  });
  add("ScatterND_none_reference", [] {
    OpTester t("ScatterND");
    t.Input(kI64, {2, 3, 4}, -9, 9).Input(I64({2, 2}, {1, -1, 0, 0})).Input(kI64, {2, 4}, -9, 9);
    t.Reference(ScatterNdRef("none"));
    return t;
  });

  // ---- GatherND (CPU only for now: these are `add` cases) ---------------------------------------
  add("GatherND_elements_neg", [] {
    OpTester t("GatherND");
    t.Input(kF32, {4, 5}).Input(I64({3, 2}, {0, 1, -1, 4, 2, -5})).FloatTypes(kAllFloats);
    t.Reference(GatherNdRef(0));
    return t;
  });
  add("GatherND_slices_3d", [] {
    OpTester t("GatherND");
    t.Input(kF32, {3, 4, 5}).Input(I64({2, 2, 1}, {0, 2, -1, 1})).FloatTypes(kAllFloats);
    t.Reference(GatherNdRef(0));
    return t;
  });
  add("GatherND_batch_dims1_i32_indices", [] {
    OpTester t("GatherND", Attrs({{"batch_dims", int64_t{1}}}));
    t.Input(kI64, {2, 3, 4}, -50, 50).Input(I32({2, 2, 2}, {2, 3, -3, 0, 1, -1, 0, 2}));
    t.Reference(GatherNdRef(1));
    return t;
  });
  add("GatherND_batch_dims2_random", [] {
    OpTester t("GatherND", Attrs({{"batch_dims", int64_t{2}}}));
    t.Input(kF32, {2, 3, 4, 5}).Input(kI64, {2, 3, 4, 1}, -4, 3);
    t.Reference(GatherNdRef(2));
    return t;
  });
  add("GatherND_bool", [] {
    OpTester t("GatherND");
    t.Input(kBool, {3, 2, 2}).Input(I64({2, 2}, {2, 1, -3, 0}));
    t.Reference(GatherNdRef(0));
    return t;
  });

  // ---- ScatterElements (CPU only for now) ------------------------------------------------------
  add("ScatterElements_axis0", [] {
    OpTester t("ScatterElements");
    // Distinct rows per column (the none reduction leaves duplicates undefined).
    t.Input(kF32, {4, 3}).Input(I64({2, 3}, {1, -1, 0, 3, 2, 2})).Input(kF32, {2, 3});
    t.FloatTypes(kAllFloats);
    t.Reference(ScatterElementsRef(0, "none"));
    return t;
  });
  add("ScatterElements_neg_axis_i32_indices", [] {
    OpTester t("ScatterElements", Attrs({{"axis", int64_t{-1}}}));
    t.Input(kI64, {3, 5}, -99, 99)
        .Input(I32({3, 2}, {4, 0, -1, 2, 1, 3}))
        .Input(kI64, {3, 2}, -99, 99);
    t.Reference(ScatterElementsRef(-1, "none"));
    return t;
  });
  add("ScatterElements_small_indices_3d", [] {
    OpTester t("ScatterElements", Attrs({{"axis", int64_t{1}}}));
    // Indices shorter than data on the other axes: only that corner is written.
    t.Input(kF32, {2, 4, 3}).Input(I64({1, 2, 2}, {3, 0, -4, 1})).Input(kF32, {1, 2, 2});
    t.Reference(ScatterElementsRef(1, "none"));
    return t;
  });
  add("ScatterElements_u8", [] {
    OpTester t("ScatterElements");
    t.Input(DataType::kUInt8, {3, 2}, 0, 255)
        .Input(I64({1, 2}, {2, 0}))
        .Input(DataType::kUInt8, {1, 2}, 0, 255);
    t.Reference(ScatterElementsRef(0, "none"));
    return t;
  });
  for (const char* red : {"add", "mul", "max", "min"}) {
    std::string r = red;
    // Duplicate indices on purpose: the reductions combine them.
    add("ScatterElements_" + r + "_i64", [r] {
      OpTester t("ScatterElements", Attrs({{"axis", int64_t{1}}, {"reduction", r}}));
      t.Input(kI64, {3, 4}, -9, 9)
          .Input(I64({3, 3}, {0, 0, 3, 1, -3, 1, 2, 2, 2}))
          .Input(kI64, {3, 3}, -9, 9);
      t.Reference(ScatterElementsRef(1, r));
      return t;
    });
    add("ScatterElements_" + r + "_f32", [r] {
      OpTester t("ScatterElements", Attrs({{"reduction", r}}));
      t.Input(kF32, {4, 3}).Input(I64({3, 3}, {1, 0, 3, -3, 0, 3, 1, 2, -1})).Input(kF32, {3, 3});
      // max and min are exact in every float type; f16/bf16 add and mul round per step.
      if (r == "max" || r == "min") t.FloatTypes(kAllFloats);
      t.Reference(ScatterElementsRef(0, r));
      return t;
    });
  }
  add("ScatterElements_add_i32", [] {
    OpTester t("ScatterElements", Attrs({{"reduction", std::string("add")}}));
    t.Input(kI32, {2, 3}, -99, 99).Input(I64({3, 1}, {1, -1, 0})).Input(kI32, {3, 1}, -99, 99);
    t.Reference(ScatterElementsRef(0, "add"));
    return t;
  });
  add("ScatterElements_max_u8", [] {
    OpTester t("ScatterElements", Attrs({{"reduction", std::string("max")}}));
    t.Input(DataType::kUInt8, {2, 3}, 0, 255)
        .Input(I64({3, 2}, {1, 0, 1, 1, 0, 0}))
        .Input(DataType::kUInt8, {3, 2}, 0, 255);
    t.Reference(ScatterElementsRef(0, "max"));
    return t;
  });

  // ---- OneHot (out-of-range indices give a row of off values) ----------------------------------
  for (int64_t axis : {-1, 0, 1}) {
    must("OneHot_axis" + std::to_string(axis), [axis] {
      OpTester t("OneHot", Attrs({{"axis", axis}}));
      t.Input(kI64, {3, 4}, -7, 6).Constant(I64({}, {5})).Input(F32({2}, {0.25f, 3.f}));
      t.FloatTypes(kAllFloats);
      return t;
    });
  }
  must("OneHot_i32_indices_i64_values", [] {
    OpTester t("OneHot");
    t.Input(kI32, {10}, -3, 9).Constant(I64({1}, {8})).Input(I64({2}, {-1, 42}));
    return t;
  });
  must("OneHot_float_indices", [] {
    OpTester t("OneHot", Attrs({{"axis", int64_t{0}}}));
    t.Input(kF32, {2, 5}, -4.5, 4.5).Constant(I64({}, {4})).Input(F32({2}, {0.f, 1.f}));
    return t;
  });

  // ---- cubic Resize ----------------------------------------------------------------------------
  struct R {
    const char* coord;
    float a;
    int exclude;
    std::vector<int64_t> x, sizes;
  };
  for (const R& z : std::vector<R>{{"half_pixel", -0.75f, 0, {1, 2, 7, 9}, {1, 2, 14, 20}},
                                   {"half_pixel", -0.5f, 1, {2, 3, 8, 6}, {2, 3, 5, 4}},
                                   {"align_corners", -0.75f, 0, {1, 1, 5, 5}, {1, 1, 9, 11}},
                                   {"asymmetric", -0.75f, 1, {1, 3, 6, 7}, {1, 3, 12, 7}},
                                   {"pytorch_half_pixel", -0.75f, 0, {1, 2, 4, 9}, {1, 2, 1, 13}},
                                   {"half_pixel", -0.75f, 0, {3, 16}, {3, 37}}}) {
    std::string name = std::string("Resize_cubic_") + z.coord + "_" +
                       std::to_string(z.sizes[z.sizes.size() - 2]) + "x" +
                       std::to_string(z.sizes.back()) + (z.exclude ? "_excl" : "");
    must(name, [z] {
      OpTester t("Resize", Attrs({{"mode", std::string("cubic")},
                                  {"coordinate_transformation_mode", std::string(z.coord)},
                                  {"cubic_coeff_a", z.a},
                                  {"exclude_outside", int64_t{z.exclude}}}));
      t.Input(kF32, z.x).Omitted().Omitted().Constant(
          I64({static_cast<int64_t>(z.sizes.size())}, z.sizes));
      // One 4^k-tap blend on CUDA, separable passes on the CPU: FP32 rounding differs.
      t.FloatTypes(kAllFloats).Tolerance(2e-5, 1e-4);
      return t;
    });
  }
  must("Resize_cubic_scales", [] {
    OpTester t("Resize", Attrs({{"mode", std::string("cubic")}}));
    t.Input(kF32, {1, 2, 5, 6}).Omitted().Constant(F32({4}, {1.f, 1.f, 1.6f, 0.7f}));
    t.FloatTypes(kAllFloats).Tolerance(2e-5, 1e-4);
    return t;
  });

  // ---- Gather (already on CUDA; its index check is new): in-range negative indices -------------
  must("Gather_runtime_indices", [] {
    OpTester t("Gather", Attrs({{"axis", int64_t{1}}}));
    t.Input(kF32, {3, 6, 2}).Input(kI64, {4}, -6, 5).FloatTypes(kAllFloats);
    return t;
  });
  return c;
}

}  // namespace kiln::testing
