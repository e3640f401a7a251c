// The op conformance tester (see op_tester.h).
#include "op_tester.h"

#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

#include "kiln/ops/op_schema.h"

namespace kiln::testing {

RefTensor RefTensor::Zeros(std::vector<int64_t> dims) {
  RefTensor t;
  t.data.assign(static_cast<size_t>(NumElements(dims)), 0.0);
  t.dims = std::move(dims);
  return t;
}

std::vector<int64_t> RefTensor::Strides() const {
  std::vector<int64_t> s(dims.size(), 1);
  for (size_t i = dims.size(); i-- > 1;) s[i - 1] = s[i] * dims[i];
  return s;
}

RefTensor ToRef(const Tensor& t) {
  RefTensor r;
  r.dims = t.dims();
  r.data.resize(static_cast<size_t>(t.num_elements()));
  for (int64_t i = 0; i < t.num_elements(); ++i) r[i] = t.GetDouble(i);
  return r;
}

Tensor MakeTensor(DataType dtype, std::vector<int64_t> dims, const std::vector<double>& values) {
  Tensor t(dtype, std::move(dims));
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    StoreFromDouble(t.view(), i, values[static_cast<size_t>(i)]);
  }
  return t;
}

Tensor Int64s(std::vector<int64_t> dims, const std::vector<int64_t>& values) {
  return Tensor::FromVector(DataType::kInt64, std::move(dims), values);
}

int64_t BroadcastIndex(const std::vector<int64_t>& dims, const std::vector<int64_t>& out_dims,
                       int64_t i) {
  int64_t in = 0, stride = 1;
  for (size_t k = 0; k < out_dims.size(); ++k) {
    size_t a = out_dims.size() - 1 - k;
    int64_t coord = i % out_dims[a];
    i /= out_dims[a];
    if (k < dims.size()) {
      size_t b = dims.size() - 1 - k;
      if (dims[b] != 1) in += coord * stride;
      stride *= dims[b];
    }
  }
  return in;
}

std::vector<int64_t> BroadcastDims(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  size_t r = std::max(a.size(), b.size());
  std::vector<int64_t> out(r);
  for (size_t k = 0; k < r; ++k) {
    int64_t da = k < a.size() ? a[a.size() - 1 - k] : 1;
    int64_t db = k < b.size() ? b[b.size() - 1 - k] : 1;
    out[r - 1 - k] = da == 1 ? db : da;
  }
  return out;
}

OpTester::OpTester(std::string op_type, AttributeMap attrs)
    : op_type_(std::move(op_type)), attrs_(std::move(attrs)) {}

OpTester& OpTester::Input(DataType dtype, std::vector<int64_t> dims, double lo, double hi) {
  inputs_.push_back({InputSpec::kRandom, dtype, std::move(dims), lo, hi, {}});
  return *this;
}
OpTester& OpTester::Input(Tensor value) {
  inputs_.push_back({InputSpec::kGiven, value.dtype(), value.dims(), 0, 0, std::move(value)});
  return *this;
}
OpTester& OpTester::Constant(Tensor value) {
  inputs_.push_back({InputSpec::kConstant, value.dtype(), value.dims(), 0, 0, std::move(value)});
  return *this;
}
OpTester& OpTester::Omitted() {
  inputs_.push_back({InputSpec::kOmitted, DataType::kUndefined, {}, 0, 0, {}});
  return *this;
}
OpTester& OpTester::Outputs(int n) {
  num_outputs_ = n;
  return *this;
}
OpTester& OpTester::Reference(ReferenceFn fn) {
  reference_ = std::move(fn);
  return *this;
}
OpTester& OpTester::Tolerance(double abs, double rel) {
  abs_tol_ = abs;
  rel_tol_ = rel;
  return *this;
}
OpTester& OpTester::FloatTypes(std::vector<DataType> types) {
  float_types_ = std::move(types);
  return *this;
}
OpTester& OpTester::Seed(uint32_t seed) {
  rng_.seed(seed);
  return *this;
}

namespace {
void SkipUnavailable(const Status& s) { GTEST_SKIP() << "backend unavailable: " << s.ToString(); }
}  // namespace

int OpTester::Run(BackendKind backend) {
  auto b = GetBackend(backend);
  if (!b.ok()) {
    SkipUnavailable(b.status());
    return 0;
  }
  int runs = 0;
  for (DataType t : float_types_) runs += RunType(backend, t);
  return runs;
}

namespace {
// Runs one kernel on `backend` with host tensors in and out.
Status RunKernel(Backend& backend, Kernel& kernel, const std::vector<Tensor>& ins,
                 const std::vector<bool>& present, std::vector<Tensor>& outs) {
  std::vector<DeviceBuffer> bufs;
  std::vector<TensorView> in_views, out_views;
  for (size_t i = 0; i < ins.size(); ++i) {
    TensorView v = ins[i].view();
    if (!present[i]) {
      in_views.push_back({});
      continue;
    }
    KILN_ASSIGN_OR_RETURN(DeviceBuffer buf, backend.Allocate(ins[i].size_bytes()));
    // Empty tensors copy nothing (and memcpy must not see their null pointers).
    if (ins[i].size_bytes() > 0) {
      KILN_RETURN_IF_ERROR(
          backend.CopyToDevice(buf.data(), ins[i].raw(), ins[i].size_bytes(), nullptr));
    }
    v.data = buf.data();
    in_views.push_back(v);
    bufs.push_back(std::move(buf));
  }
  for (Tensor& o : outs) {
    KILN_ASSIGN_OR_RETURN(DeviceBuffer buf, backend.Allocate(o.size_bytes()));
    // Poison the outputs so a kernel that skips elements is caught.
    std::vector<std::byte> poison(o.size_bytes(), std::byte{0x7f});
    if (!poison.empty()) {
      KILN_RETURN_IF_ERROR(backend.CopyToDevice(buf.data(), poison.data(), poison.size(), nullptr));
    }
    TensorView v = o.view();
    v.data = buf.data();
    out_views.push_back(v);
    bufs.push_back(std::move(buf));
  }
  KILN_ASSIGN_OR_RETURN(size_t ws_bytes, kernel.Prepare(in_views, out_views));
  KILN_ASSIGN_OR_RETURN(DeviceBuffer ws, backend.Allocate(ws_bytes));
  KernelRunArgs args;
  args.inputs = in_views;
  args.outputs = out_views;
  args.workspace = ws.data();
  args.workspace_bytes = ws_bytes;
  KILN_RETURN_IF_ERROR(kernel.Run(args));
  KILN_RETURN_IF_ERROR(backend.Synchronize(nullptr));
  for (size_t i = 0; i < outs.size(); ++i) {
    if (outs[i].size_bytes() == 0) continue;
    KILN_RETURN_IF_ERROR(backend.CopyToHost(outs[i].mutable_raw(), out_views[i].data,
                                            outs[i].size_bytes(), nullptr));
  }
  return OkStatus();
}
}  // namespace

StatusOr<std::unique_ptr<OpTester::Layer>> OpTester::Request(DataType float_type) const {
  auto l = std::make_unique<Layer>();
  std::vector<Value*> in_values, out_values;
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const InputSpec& in = inputs_[i];
    if (in.kind == InputSpec::kOmitted) {
      in_values.push_back(nullptr);
      l->request.inputs.emplace_back();
      continue;
    }
    const DataType t = IsFloat(in.dtype) ? float_type : in.dtype;
    const Tensor* constant = nullptr;
    if (in.kind == InputSpec::kConstant) {
      Tensor c = IsFloat(in.dtype) ? in.value.CastTo(t) : in.value;
      in_values.push_back(l->graph.AddConstant(fmt::format("c{}", i), c));
      constant = in_values.back()->constant();
    } else {
      in_values.push_back(l->graph.AddInput(fmt::format("x{}", i), t, MakeShape(in.dims)));
    }
    l->request.inputs.push_back({t, MakeShape(in.dims), in.dims, constant});
  }
  for (int i = 0; i < num_outputs_; ++i) {
    out_values.push_back(l->graph.AddValue(fmt::format("y{}", i)));
  }
  l->request.node = l->graph.AddNode(op_type_, "node", in_values, out_values, attrs_);
  for (Value* v : out_values) l->graph.MarkOutput(v);
  KILN_RETURN_IF_ERROR(InferShapes(l->graph).status());
  for (Value* v : out_values) {
    auto dims = StaticDims(v->shape());
    if (!dims) return MakeError(ErrorCode::kShapeMismatch, "output shape is not static");
    l->request.outputs.push_back({v->dtype(), v->shape(), *dims, nullptr});
  }
  return l;
}

int OpTester::RunType(BackendKind backend_kind, DataType float_type) {
  SCOPED_TRACE(fmt::format("{} as {}", op_type_, ToString(float_type)));
  // Inputs: random ones drawn fresh, float ones cast to the storage type under test.
  std::vector<Tensor> values;
  std::vector<bool> present;
  for (InputSpec& in : inputs_) {
    if (in.kind == InputSpec::kOmitted) {
      values.emplace_back();
      present.push_back(false);
      continue;
    }
    Tensor t;
    if (in.kind == InputSpec::kRandom) {
      t = Tensor(in.dtype, in.dims);
      std::uniform_real_distribution<double> dist(in.lo, in.hi);
      bool any_nonzero = false;
      for (int64_t i = 0; i < t.num_elements(); ++i) {
        double x = dist(rng_);
        if (IsInteger(in.dtype)) x = std::round(x);
        if (in.dtype == DataType::kBool) x = x > (in.lo + in.hi) / 2 ? 1 : 0;
        StoreFromDouble(t.view(), i, x);
        any_nonzero |= t.GetDouble(i) != 0;
      }
      if (!any_nonzero && t.num_elements() > 0) StoreFromDouble(t.view(), 0, in.hi);
    } else {
      t = in.value;
    }
    if (IsFloat(t.dtype()) && t.dtype() != float_type) t = t.CastTo(float_type);
    values.push_back(std::move(t));
    present.push_back(true);
  }

  Graph g;
  std::vector<Value*> in_values;
  for (size_t i = 0; i < values.size(); ++i) {
    if (!present[i]) {
      in_values.push_back(nullptr);
    } else if (inputs_[i].kind == InputSpec::kConstant) {
      in_values.push_back(g.AddConstant(fmt::format("c{}", i), values[i]));
    } else {
      in_values.push_back(
          g.AddInput(fmt::format("x{}", i), values[i].dtype(), MakeShape(values[i].dims())));
    }
  }
  std::vector<Value*> out_values;
  for (int i = 0; i < num_outputs_; ++i) out_values.push_back(g.AddValue(fmt::format("y{}", i)));
  Node* node = g.AddNode(op_type_, "node", in_values, out_values, attrs_);
  for (Value* v : out_values) g.MarkOutput(v);
  auto inferred = InferShapes(g);
  EXPECT_TRUE(inferred.ok()) << inferred.status().ToString();
  if (!inferred.ok()) return 0;

  KernelRequest request;
  request.node = node;
  for (size_t i = 0; i < values.size(); ++i) {
    OperandDesc d;
    if (present[i]) {
      d.dtype = values[i].dtype();
      d.shape = MakeShape(values[i].dims());
      d.max_dims = values[i].dims();
      if (inputs_[i].kind == InputSpec::kConstant) d.constant = in_values[i]->constant();
    }
    request.inputs.push_back(std::move(d));
  }
  std::vector<Tensor> outs;
  for (Value* v : out_values) {
    auto dims = StaticDims(v->shape());
    EXPECT_TRUE(dims.has_value()) << "output shape " << ToString(v->shape()) << " is not static";
    if (!dims) return 0;
    request.outputs.push_back({v->dtype(), v->shape(), *dims, nullptr});
    outs.emplace_back(v->dtype(), *dims);
  }

  // Expected outputs: the reference on the inputs as stored.
  std::vector<RefTensor> expected;
  if (reference_) {
    std::vector<RefTensor> ref_in;
    for (size_t i = 0; i < values.size(); ++i) {
      ref_in.push_back(present[i] ? ToRef(values[i]) : RefTensor{});
    }
    expected = reference_(ref_in);
  }

  Backend* backend = *GetBackend(backend_kind);
  Backend* cpu = *GetBackend(BackendKind::kCpu);
  if (!reference_) {
    // Device backends are checked against the CPU backend's first tactic.
    auto providers = KernelRegistry::Get().Providers(BackendKind::kCpu, op_type_);
    for (const KernelProvider* p : providers) {
      auto tactics = p->Tactics(request);
      if (tactics.empty()) continue;
      auto kernel = p->Create(request, tactics[0]);
      EXPECT_TRUE(kernel.ok()) << kernel.status().ToString();
      if (!kernel.ok()) return 0;
      std::vector<Tensor> cpu_outs;
      for (const Tensor& o : outs) cpu_outs.emplace_back(o.dtype(), o.dims());
      Status s = RunKernel(*cpu, **kernel, values, present, cpu_outs);
      EXPECT_TRUE(s.ok()) << s.ToString();
      for (const Tensor& o : cpu_outs) expected.push_back(ToRef(o));
      break;
    }
    EXPECT_FALSE(expected.empty()) << "no CPU reference for " << op_type_;
  }
  EXPECT_EQ(expected.size(), outs.size());
  if (expected.size() != outs.size()) return 0;

  int runs = 0;
  for (const KernelProvider* p : KernelRegistry::Get().Providers(backend_kind, op_type_)) {
    for (const TacticConfig& tactic : p->Tactics(request)) {
      SCOPED_TRACE(fmt::format("provider {} tactic {}", p->id(), tactic.name));
      auto kernel = p->Create(request, tactic);
      EXPECT_TRUE(kernel.ok()) << kernel.status().ToString();
      if (!kernel.ok()) continue;
      Status s = RunKernel(*backend, **kernel, values, present, outs);
      EXPECT_TRUE(s.ok()) << s.ToString();
      if (!s.ok()) continue;
      ++runs;
      for (size_t o = 0; o < outs.size(); ++o) {
        const RefTensor& want = expected[o];
        if (!want.dims.empty() || want.data.size() == 1) {
          EXPECT_EQ(want.dims, outs[o].dims()) << "output " << o << " dims";
        }
        EXPECT_EQ(want.size(), outs[o].num_elements()) << "output " << o << " size";
        if (want.size() != outs[o].num_elements()) continue;
        DataType t = outs[o].dtype();
        double rel = t == DataType::kFloat16 ? 1e-2 : (t == DataType::kBFloat16 ? 2e-2 : rel_tol_);
        double abs = t == DataType::kFloat32 || t == DataType::kFloat64 ? abs_tol_
                     : IsFloat(t)                                       ? rel
                                                                        : 0.0;
        int bad = 0;
        for (int64_t i = 0; i < want.size() && bad < 5; ++i) {
          double got = outs[o].GetDouble(i), w = want[i];
          bool ok = (std::isnan(w) && std::isnan(got)) || got == w ||
                    (IsFloatingPoint(t) && std::fabs(got - w) <= abs + rel * std::fabs(w));
          if (!ok) {
            ++bad;
            ADD_FAILURE() << "output " << o << " element " << i << ": got " << got << ", want "
                          << w;
          }
        }
      }
    }
  }
  if (backend_kind == BackendKind::kCpu) {
    // The CPU backend is the reference: it implements every op.
    EXPECT_GT(runs, 0) << "no cpu tactic for " << op_type_ << " (" << ToString(float_type) << ")";
  } else if (runs == 0) {
    // A device backend may lack an op (the builder names such layers, KILN-E3003); what it does
    // implement is checked above. Its coverage of the zoo is asserted in tests/backends/cuda.
    std::cout << "note: no " << ToString(backend_kind) << " tactic for " << op_type_ << " ("
              << ToString(float_type) << "); not checked on this backend\n";
  }
  return runs;
}

}  // namespace kiln::testing
