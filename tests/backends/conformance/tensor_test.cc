// Conformance of the shape and data-movement ops (Reshape, Transpose, Concat, Split, Slice,
// Gather, Pad, Expand, Tile, ...) against naive references, for every backend.
#include "op_tester.h"

namespace kiln::testing {
namespace {

using enum DataType;

std::vector<int64_t> Unravel(int64_t i, const std::vector<int64_t>& dims) {
  std::vector<int64_t> c(dims.size());
  for (size_t a = dims.size(); a-- > 0;) {
    c[a] = i % dims[a];
    i /= dims[a];
  }
  return c;
}
AttributeMap Attrs(std::initializer_list<std::pair<const char*, Attribute>> kv) {
  AttributeMap m;
  for (auto& [k, v] : kv) m.Set(k, v);
  return m;
}

// Output = input elements in order with new dims (Reshape and friends).
ReferenceFn SameData(std::vector<int64_t> dims) {
  return [dims](const std::vector<RefTensor>& in) {
    RefTensor out = in[0];
    out.dims = dims;
    return std::vector<RefTensor>{out};
  };
}

class TensorOps : public BackendTest {};

TEST_P(TensorOps, ReshapeFlattenSqueezeUnsqueezeIdentity) {
  std::vector<DataType> types = {kFloat32, kFloat16, kBFloat16};
  OpTester("Reshape")
      .Input(kFloat32, {2, 3, 8})
      .Constant(Int64s({4}, {0, -1, 4, 2}))
      .FloatTypes(types)
      .Reference(SameData({2, 3, 4, 2}))
      .Run(GetParam());
  OpTester("Reshape")
      .Input(kInt64, {6, 2}, -50, 50)
      .Constant(Int64s({2}, {3, 4}))
      .Reference(SameData({3, 4}))
      .Run(GetParam());
  OpTester("Flatten", Attrs({{"axis", int64_t{2}}}))
      .Input(kFloat32, {2, 3, 4, 5})
      .Reference(SameData({6, 20}))
      .Run(GetParam());
  OpTester("Squeeze")
      .Input(kInt32, {1, 3, 1, 2}, -9, 9)
      .Constant(Int64s({1}, {-2}))
      .Reference(SameData({1, 3, 2}))
      .Run(GetParam());
  OpTester("Squeeze").Input(kFloat32, {1, 3, 1, 2}).Reference(SameData({3, 2})).Run(GetParam());
  OpTester("Unsqueeze")
      .Input(kBool, {3, 2})
      .Constant(Int64s({2}, {0, -1}))
      .Reference(SameData({1, 3, 2, 1}))
      .Run(GetParam());
  OpTester("Identity").Input(kInt64, {7}, -9, 9).Reference(SameData({7})).Run(GetParam());
}

TEST_P(TensorOps, ShapeSizeConstantOfShapeRange) {
  OpTester("Shape", Attrs({{"start", int64_t{1}}, {"end", int64_t{-1}}}))
      .Input(kFloat32, {2, 3, 4, 5})
      .Reference([](const std::vector<RefTensor>&) {
        return std::vector<RefTensor>{{{2}, {3, 4}}};
      })
      .Run(GetParam());
  OpTester("Size")
      .Input(kFloat16, {2, 3, 4})
      .Reference([](const std::vector<RefTensor>&) {
        return std::vector<RefTensor>{{{}, {24}}};
      })
      .Run(GetParam());
  OpTester("ConstantOfShape", Attrs({{"value", Int64s({1}, {7})}}))
      .Constant(Int64s({2}, {2, 3}))
      .Reference([](const std::vector<RefTensor>&) {
        return std::vector<RefTensor>{{{2, 3}, std::vector<double>(6, 7.0)}};
      })
      .Run(GetParam());
  OpTester("Range")
      .Constant(Int64s({}, {10}))
      .Constant(Int64s({}, {-3}))
      .Constant(Int64s({}, {-4}))
      .Reference([](const std::vector<RefTensor>&) {
        return std::vector<RefTensor>{{{4}, {10, 6, 2, -2}}};
      })
      .Run(GetParam());
  OpTester("Range")
      .Constant(MakeTensor(kFloat32, {}, {0.5}))
      .Constant(MakeTensor(kFloat32, {}, {2.0}))
      .Constant(MakeTensor(kFloat32, {}, {0.25}))
      .Reference([](const std::vector<RefTensor>&) {
        return std::vector<RefTensor>{{{6}, {0.5, 0.75, 1.0, 1.25, 1.5, 1.75}}};
      })
      .Run(GetParam());
  // FP16/BF16 bounds (computed in float, stash_type 1), counting down.
  for (DataType t : {kFloat16, kBFloat16}) {
    OpTester("Range")
        .Constant(MakeTensor(t, {}, {3.0}))
        .Constant(MakeTensor(t, {}, {-1.0}))
        .Constant(MakeTensor(t, {}, {-0.75}))
        .Reference([](const std::vector<RefTensor>&) {
          return std::vector<RefTensor>{{{6}, {3.0, 2.25, 1.5, 0.75, 0.0, -0.75}}};
        })
        .Run(GetParam());
  }
}

ReferenceFn TransposeRef(std::vector<int64_t> perm) {
  return [perm](const std::vector<RefTensor>& in) {
    const RefTensor& x = in[0];
    std::vector<int64_t> dims;
    for (int64_t p : perm) dims.push_back(x.dims[p]);
    RefTensor out = RefTensor::Zeros(dims);
    std::vector<int64_t> xs = x.Strides();
    for (int64_t i = 0; i < out.size(); ++i) {
      std::vector<int64_t> c = Unravel(i, dims);
      int64_t src = 0;
      for (size_t a = 0; a < perm.size(); ++a) src += c[a] * xs[perm[a]];
      out[i] = x[src];
    }
    return std::vector<RefTensor>{out};
  };
}

TEST_P(TensorOps, TransposeCommonAndOddPerms) {
  struct Case {
    std::vector<int64_t> dims, perm;
  };
  std::vector<Case> cases = {{{37, 45}, {1, 0}},
                             {{2, 5, 3, 7}, {0, 2, 1, 3}},
                             {{2, 3, 40, 33}, {0, 2, 3, 1}},
                             {{2, 33, 3, 40}, {0, 3, 1, 2}},
                             {{2, 4, 5, 6}, {0, 1, 3, 2}},
                             {{3, 1, 4, 5}, {2, 0, 3, 1}},
                             {{2, 3, 4}, {2, 1, 0}},
                             {{5}, {0}}};
  for (const Case& c : cases) {
    SCOPED_TRACE(fmt::format("perm {}", fmt::join(c.perm, ",")));
    OpTester("Transpose", Attrs({{"perm", c.perm}}))
        .Input(kFloat32, c.dims)
        .FloatTypes({kFloat32, kFloat16})
        .Reference(TransposeRef(c.perm))
        .Run(GetParam());
  }
  OpTester("Transpose")
      .Input(kInt64, {3, 4, 2}, -9, 9)
      .Reference(TransposeRef({2, 1, 0}))
      .Run(GetParam());
  OpTester("Transpose", Attrs({{"perm", std::vector<int64_t>{1, 0}}}))
      .Input(kBool, {9, 7})
      .Reference(TransposeRef({1, 0}))
      .Run(GetParam());
}

TEST_P(TensorOps, ConcatAndSplit) {
  OpTester("Concat", Attrs({{"axis", int64_t{-2}}}))
      .Input(kFloat32, {2, 3, 4})
      .Input(kFloat32, {2, 1, 4})
      .Input(kFloat32, {2, 0, 4})
      .Input(kFloat32, {2, 2, 4})
      .FloatTypes({kFloat32, kBFloat16})
      .Reference([](const std::vector<RefTensor>& in) {
        RefTensor out = RefTensor::Zeros({2, 6, 4});
        for (int64_t b = 0; b < 2; ++b) {
          int64_t row = 0;
          for (const RefTensor& t : in) {
            for (int64_t r = 0; r < t.dims[1]; ++r, ++row) {
              for (int64_t k = 0; k < 4; ++k)
                out[(b * 6 + row) * 4 + k] = t[(b * t.dims[1] + r) * 4 + k];
            }
          }
        }
        return std::vector<RefTensor>{out};
      })
      .Run(GetParam());
  OpTester("Concat", Attrs({{"axis", int64_t{0}}}))
      .Input(Int64s({2}, {5, 6}))
      .Input(Int64s({1}, {-1}))
      .Reference([](const std::vector<RefTensor>&) {
        return std::vector<RefTensor>{{{3}, {5, 6, -1}}};
      })
      .Run(GetParam());
  auto split_ref = [](std::vector<int64_t> sizes) {
    return [sizes](const std::vector<RefTensor>& in) {
      std::vector<RefTensor> outs;
      int64_t start = 0;
      for (int64_t s : sizes) {
        RefTensor o = RefTensor::Zeros({3, s});
        for (int64_t r = 0; r < 3; ++r) {
          for (int64_t c = 0; c < s; ++c) o[r * s + c] = in[0][r * 7 + start + c];
        }
        start += s;
        outs.push_back(o);
      }
      return outs;
    };
  };
  OpTester("Split", Attrs({{"axis", int64_t{1}}}))
      .Input(kFloat32, {3, 7})
      .Constant(Int64s({3}, {2, 4, 1}))
      .Outputs(3)
      .Reference(split_ref({2, 4, 1}))
      .Run(GetParam());
  OpTester("Split", Attrs({{"axis", int64_t{-1}}, {"num_outputs", int64_t{3}}}))
      .Input(kFloat32, {3, 7})
      .Outputs(3)
      .Reference(split_ref({3, 3, 1}))
      .Run(GetParam());
}

// Naive ONNX Slice over all axes given.
ReferenceFn SliceRef(std::vector<int64_t> starts, std::vector<int64_t> ends,
                     std::vector<int64_t> axes, std::vector<int64_t> steps) {
  return [=](const std::vector<RefTensor>& in) {
    const RefTensor& x = in[0];
    size_t rank = x.dims.size();
    std::vector<std::vector<int64_t>> idx(rank);
    for (size_t a = 0; a < rank; ++a) {
      for (int64_t i = 0; i < x.dims[a]; ++i) idx[a].push_back(i);
    }
    for (size_t k = 0; k < axes.size(); ++k) {
      int64_t a = axes[k] < 0 ? axes[k] + rank : axes[k], n = x.dims[a];
      int64_t s = starts[k], e = ends[k], st = steps[k];
      s = s < 0 ? s + n : s;
      e = e < 0 ? e + n : e;
      idx[a].clear();
      if (st > 0) {
        s = std::clamp<int64_t>(s, 0, n);
        e = std::clamp<int64_t>(e, 0, n);
        for (int64_t i = s; i < e; i += st) idx[a].push_back(i);
      } else {
        s = std::clamp<int64_t>(s, 0, n - 1);
        e = std::clamp<int64_t>(e, -1, n - 1);
        for (int64_t i = s; i > e; i += st) idx[a].push_back(i);
      }
    }
    std::vector<int64_t> dims;
    for (auto& v : idx) dims.push_back(static_cast<int64_t>(v.size()));
    RefTensor out = RefTensor::Zeros(dims);
    std::vector<int64_t> xs = x.Strides();
    for (int64_t i = 0; i < out.size(); ++i) {
      std::vector<int64_t> c = Unravel(i, dims);
      int64_t src = 0;
      for (size_t a = 0; a < rank; ++a) src += idx[a][c[a]] * xs[a];
      out[i] = x[src];
    }
    return std::vector<RefTensor>{out};
  };
}

TEST_P(TensorOps, SliceNegativeClampedAndStepped) {
  struct Case {
    std::vector<int64_t> starts, ends, axes, steps;
  };
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  std::vector<Case> cases = {
      {{1, 0}, {3, 10}, {0, 1}, {1, 1}},
      {{-3}, {kMax}, {2}, {1}},
      {{0, -1}, {-1, -kMax}, {1, 2}, {2, -1}},
      {{-1000}, {1000}, {-1}, {3}},
      {{5}, {1}, {2}, {-2}},
  };
  for (const Case& c : cases) {
    int64_t n = static_cast<int64_t>(c.starts.size());
    OpTester("Slice")
        .Input(kFloat32, {4, 5, 6})
        .Constant(Int64s({n}, c.starts))
        .Constant(Int64s({n}, c.ends))
        .Constant(Int64s({n}, c.axes))
        .Constant(Int64s({n}, c.steps))
        .FloatTypes({kFloat32, kFloat16})
        .Reference(SliceRef(c.starts, c.ends, c.axes, c.steps))
        .Run(GetParam());
  }
  OpTester("Slice")
      .Input(kInt64, {6}, -9, 9)
      .Constant(Int64s({1}, {1}))
      .Constant(Int64s({1}, {-1}))
      .Reference(SliceRef({1}, {-1}, {0}, {1}))
      .Run(GetParam());
}

TEST_P(TensorOps, GatherAndGatherElements) {
  auto gather_ref = [](int64_t axis) {
    return [axis](const std::vector<RefTensor>& in) {
      const RefTensor &x = in[0], &ind = in[1];
      std::vector<int64_t> dims(x.dims.begin(), x.dims.begin() + axis);
      dims.insert(dims.end(), ind.dims.begin(), ind.dims.end());
      dims.insert(dims.end(), x.dims.begin() + axis + 1, x.dims.end());
      RefTensor out = RefTensor::Zeros(dims);
      int64_t q = static_cast<int64_t>(ind.dims.size());
      std::vector<int64_t> xs = x.Strides();
      for (int64_t i = 0; i < out.size(); ++i) {
        std::vector<int64_t> c = Unravel(i, dims);
        std::vector<int64_t> ic(c.begin() + axis, c.begin() + axis + q);
        int64_t k = 0;
        for (size_t a = 0; a < ic.size(); ++a) k = k * ind.dims[a] + ic[a];
        int64_t j = static_cast<int64_t>(ind[k]);
        if (j < 0) j += x.dims[axis];
        int64_t src = 0;
        for (int64_t a = 0; a < static_cast<int64_t>(x.dims.size()); ++a) {
          int64_t coord = a < axis ? c[a] : (a == axis ? j : c[a - 1 + q]);
          src += coord * xs[a];
        }
        out[i] = x[src];
      }
      return std::vector<RefTensor>{out};
    };
  };
  OpTester("Gather")
      .Input(kFloat32, {10, 4})
      .Input(Int64s({2, 3}, {0, 9, -1, 3, 3, -10}))
      .FloatTypes({kFloat32, kFloat16, kBFloat16})
      .Reference(gather_ref(0))
      .Run(GetParam());
  OpTester("Gather", Attrs({{"axis", int64_t{1}}}))
      .Input(kInt64, {2, 5, 3}, -9, 9)
      .Input(Tensor::FromVector(kInt32, {4}, std::vector<int32_t>{4, 0, -2, 1}))
      .Reference(gather_ref(1))
      .Run(GetParam());
  OpTester("Gather")
      .Input(Int64s({4}, {2, 16, 64, 8}))
      .Constant(Int64s({}, {-2}))
      .Reference([](const std::vector<RefTensor>&) {
        return std::vector<RefTensor>{{{}, {64}}};
      })
      .Run(GetParam());
  OpTester("GatherElements", Attrs({{"axis", int64_t{1}}}))
      .Input(kFloat32, {3, 4})
      .Input(Int64s({3, 2}, {0, 3, -1, 1, 2, 2}))
      .Reference([](const std::vector<RefTensor>& in) {
        RefTensor out = RefTensor::Zeros({3, 2});
        for (int64_t r = 0; r < 3; ++r) {
          for (int64_t c = 0; c < 2; ++c) {
            int64_t j = static_cast<int64_t>(in[1][r * 2 + c]);
            out[r * 2 + c] = in[0][r * 4 + (j < 0 ? j + 4 : j)];
          }
        }
        return std::vector<RefTensor>{out};
      })
      .Run(GetParam());
  OpTester("ScatterND")
      .Input(kFloat32, {4, 3})
      .Input(Int64s({2, 1}, {2, 0}))
      .Input(kFloat32, {2, 3})
      .Reference([](const std::vector<RefTensor>& in) {
        RefTensor out = in[0];
        for (int64_t k = 0; k < 3; ++k) {
          out[2 * 3 + k] = in[2][k];
          out[0 * 3 + k] = in[2][3 + k];
        }
        return std::vector<RefTensor>{out};
      })
      .Run(GetParam());
}

// out[i] = x[map(coords)], for Pad/Expand/Tile references.
ReferenceFn IndexMapRef(std::vector<int64_t> out_dims,
                        std::function<int64_t(int64_t axis, int64_t o, int64_t n)> map) {
  return [=](const std::vector<RefTensor>& in) {
    const RefTensor& x = in[0];
    size_t lead = out_dims.size() - x.dims.size();
    RefTensor out = RefTensor::Zeros(out_dims);
    std::vector<int64_t> xs = x.Strides();
    double fill = in.size() > 2 && !in[2].data.empty() ? in[2][0] : 0.0;
    for (int64_t i = 0; i < out.size(); ++i) {
      std::vector<int64_t> c = Unravel(i, out_dims);
      int64_t src = 0;
      bool pad = false;
      for (size_t a = lead; a < out_dims.size(); ++a) {
        int64_t m = map(static_cast<int64_t>(a), c[a], x.dims[a - lead]);
        if (m < 0) pad = true;
        src += m * xs[a - lead];
      }
      out[i] = pad ? fill : x[src];
    }
    return std::vector<RefTensor>{out};
  };
}

TEST_P(TensorOps, PadModes) {
  // pads: axis0 (1, 0), axis1 (2, 3)
  std::vector<int64_t> pads = {1, 2, 0, 3};
  std::vector<int64_t> begin = {1, 2};
  auto constant = [=](int64_t a, int64_t o, int64_t n) {
    int64_t i = o - begin[a];
    return i >= 0 && i < n ? i : -1;
  };
  auto edge = [=](int64_t a, int64_t o, int64_t n) {
    return std::clamp<int64_t>(o - begin[a], 0, n - 1);
  };
  auto reflect = [=](int64_t a, int64_t o, int64_t n) {
    int64_t i = o - begin[a];
    if (i < 0) i = -i;
    if (i >= n) i = 2 * (n - 1) - i;
    return i;
  };
  OpTester("Pad")
      .Input(kFloat32, {3, 4})
      .Constant(Int64s({4}, pads))
      .Constant(MakeTensor(kFloat32, {}, {1.5}))
      .FloatTypes({kFloat32, kFloat16})
      .Reference(IndexMapRef({4, 9}, constant))
      .Run(GetParam());
  OpTester("Pad", Attrs({{"mode", std::string("edge")}}))
      .Input(kInt64, {3, 4}, -9, 9)
      .Constant(Int64s({4}, pads))
      .Reference(IndexMapRef({4, 9}, edge))
      .Run(GetParam());
  OpTester("Pad", Attrs({{"mode", std::string("reflect")}}))
      .Input(kFloat32, {3, 4})
      .Constant(Int64s({4}, pads))
      .Reference(IndexMapRef({4, 9}, reflect))
      .Run(GetParam());
  // axes input: pad only the last axis.
  OpTester("Pad")
      .Input(kFloat32, {2, 3})
      .Constant(Int64s({2}, {1, 1}))
      .Omitted()
      .Constant(Int64s({1}, {-1}))
      .Reference(IndexMapRef({2, 5},
                             [](int64_t a, int64_t o, int64_t n) -> int64_t {
                               if (a == 0) return o;
                               return o >= 1 && o <= n ? o - 1 : -1;
                             }))
      .Run(GetParam());
}

TEST_P(TensorOps, ExpandAndTile) {
  OpTester("Expand")
      .Input(kFloat32, {3, 1})
      .Constant(Int64s({3}, {2, 1, 4}))
      .FloatTypes({kFloat32, kBFloat16})
      .Reference(
          IndexMapRef({2, 3, 4}, [](int64_t, int64_t o, int64_t n) { return n == 1 ? 0 : o; }))
      .Run(GetParam());
  OpTester("Expand")
      .Input(kInt64, {1, 5}, -9, 9)
      .Constant(Int64s({2}, {3, 1}))
      .Reference(IndexMapRef({3, 5}, [](int64_t, int64_t o, int64_t n) { return n == 1 ? 0 : o; }))
      .Run(GetParam());
  OpTester("Tile")
      .Input(kFloat32, {2, 3})
      .Constant(Int64s({2}, {3, 2}))
      .Reference(IndexMapRef({6, 6}, [](int64_t, int64_t o, int64_t n) { return o % n; }))
      .Run(GetParam());
}

TEST_P(TensorOps, TriluOneHotDepthSpace) {
  for (int64_t upper : {0, 1}) {
    for (int64_t k : {-1, 0, 2}) {
      OpTester("Trilu", Attrs({{"upper", upper}}))
          .Input(kFloat32, {2, 4, 5})
          .Constant(Int64s({}, {k}))
          .Reference([=](const std::vector<RefTensor>& in) {
            RefTensor out = in[0];
            for (int64_t i = 0; i < out.size(); ++i) {
              int64_t r = (i / 5) % 4, c = i % 5;
              bool keep = upper ? c - r >= k : c - r <= k;
              if (!keep) out[i] = 0;
            }
            return std::vector<RefTensor>{out};
          })
          .Run(GetParam());
    }
  }
  OpTester("OneHot", Attrs({{"axis", int64_t{1}}}))
      .Input(Int64s({2, 2}, {0, 3, -1, 1}))
      .Constant(Int64s({}, {4}))
      .Constant(MakeTensor(kFloat32, {2}, {-1.0, 2.5}))
      .Reference([](const std::vector<RefTensor>& in) {
        RefTensor out = RefTensor::Zeros({2, 4, 2});
        for (int64_t b = 0; b < 2; ++b) {
          for (int64_t d = 0; d < 4; ++d) {
            for (int64_t j = 0; j < 2; ++j) {
              int64_t idx = static_cast<int64_t>(in[0][b * 2 + j]);
              if (idx < 0) idx += 4;
              out[(b * 4 + d) * 2 + j] = idx == d ? 2.5 : -1.0;
            }
          }
        }
        return std::vector<RefTensor>{out};
      })
      .Run(GetParam());
  // DepthToSpace DCR: out[n, c, h*b+i, w*b+j] = in[n, (i*b+j)*C' + c, h, w].
  for (std::string mode : {"DCR", "CRD"}) {
    OpTester("DepthToSpace", Attrs({{"blocksize", int64_t{2}}, {"mode", mode}}))
        .Input(kFloat32, {1, 8, 2, 3})
        .Reference([mode](const std::vector<RefTensor>& in) {
          RefTensor out = RefTensor::Zeros({1, 2, 4, 6});
          for (int64_t c = 0; c < 2; ++c) {
            for (int64_t y = 0; y < 4; ++y) {
              for (int64_t x = 0; x < 6; ++x) {
                int64_t i = y % 2, j = x % 2;
                int64_t ic = mode == "DCR" ? (i * 2 + j) * 2 + c : c * 4 + i * 2 + j;
                out[(c * 4 + y) * 6 + x] = in[0][(ic * 2 + y / 2) * 3 + x / 2];
              }
            }
          }
          return std::vector<RefTensor>{out};
        })
        .Run(GetParam());
  }
  OpTester("SpaceToDepth", Attrs({{"blocksize", int64_t{2}}}))
      .Input(kFloat32, {1, 2, 4, 6})
      .Reference([](const std::vector<RefTensor>& in) {
        RefTensor out = RefTensor::Zeros({1, 8, 2, 3});
        for (int64_t c = 0; c < 2; ++c) {
          for (int64_t y = 0; y < 4; ++y) {
            for (int64_t x = 0; x < 6; ++x) {
              int64_t oc = ((y % 2) * 2 + x % 2) * 2 + c;
              out[(oc * 2 + y / 2) * 3 + x / 2] = in[0][(c * 4 + y) * 6 + x];
            }
          }
        }
        return std::vector<RefTensor>{out};
      })
      .Run(GetParam());
}

KILN_INSTANTIATE_BACKENDS(TensorOps);

}  // namespace
}  // namespace kiln::testing
