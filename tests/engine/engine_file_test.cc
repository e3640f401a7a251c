// Engine file tests: round trip, determinism, atomic write, zero-copy weights, and every class of
// bad input with its catalog code (crafted files re-checksummed so only the bounds checks stand
// between them and an out-of-bounds read).
#include "kiln/engine/engine_file.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include "kiln/engine/engine_generated.h"
#include "tests/engine/test_engines.h"

namespace kiln {
namespace {

using Bytes = std::vector<std::byte>;

std::unique_ptr<EngineDesc> Chain() {
  auto e = testing::AssembleTestEngine(testing::MakeChainGraph(), testing::ChainProfile());
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  (*e)->layers[1].measured_ms = 0.125;
  return std::move(*e);
}

Bytes Serialize(const EngineDesc& e) {
  auto bytes = SerializeEngine(e);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  return std::move(*bytes);
}

Bytes ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Bytes out(chars.size());
  std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

// The names of the files in `dir`, to check that no temporary was left behind.
std::vector<std::string> FileNames(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  return names;
}

// Recomputes the checksum after a test edits the payload, as a forger would.
void Reseal(Bytes& b) {
  auto p = ReadEnginePreamble(b);
  ASSERT_TRUE(p.ok());
  WriteEnginePreamble(*p, b);
  SealEnginePreamble(b, HashBytes(std::span(b).subspan(kEnginePreambleBytes)));
}

fb::Engine* Mutable(Bytes& b) {
  return fb::GetMutableEngine(reinterpret_cast<uint8_t*>(b.data() + kEnginePreambleBytes));
}

Status LoadStatus(const Bytes& b, const LoadOptions& options = {}) {
  return LoadEngineBytes(b, options).status();
}

std::string Describe(const Attribute& a) {
  if (KindOf(a) == AttributeKind::kTensor) {
    const Tensor& t = std::get<Tensor>(a);
    std::string out = std::string(ToString(t.dtype())) + ":";
    for (int64_t i = 0; i < t.num_elements(); ++i) out += std::to_string(t.GetInt(i)) + ",";
    return out;
  }
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, float>) {
          return std::to_string(v);
        } else if constexpr (std::is_same_v<T, std::string>) {
          return v;
        } else if constexpr (std::is_same_v<T, Tensor>) {
          return "";
        } else {
          std::string out;
          for (const auto& x : v) {
            if constexpr (std::is_same_v<std::decay_t<decltype(x)>, std::string>) {
              out += x + "|";
            } else {
              out += std::to_string(x) + "|";
            }
          }
          return out;
        }
      },
      a);
}

// A full structural description of an engine, so two engines compare with one EXPECT_EQ.
std::string Fingerprint(const EngineDesc& e) {
  std::string s;
  const EngineHeader& h = e.header;
  s += fmt::format("header {} {} {} {} {} {} {} stripped={}\n", h.format_version,
                   ToString(h.backend), h.device_arch, h.library_versions, h.model_hash,
                   h.config_hash, h.model_name, h.weights_stripped);
  const Graph& g = *e.graph;
  s += fmt::format("graph {} opset {}\n", g.name(), g.opset());
  for (const Value* v : g.values()) {
    s += fmt::format("value {} {} {} {} in={} out={}", v->name(), ToString(v->dtype()),
                     v->has_shape() ? ToString(v->shape()) : "-", v->is_constant(),
                     v->is_graph_input(), v->is_graph_output());
    if (const Tensor* t = v->constant(); t && !t->raw()) {
      s += fmt::format(" absent {}[{}]", ToString(t->dtype()), fmt::join(t->dims(), ","));
    } else if (t) {
      for (int64_t i = 0; i < t->num_elements(); ++i) s += fmt::format(" {}", t->GetDouble(i));
    }
    s += "\n";
  }
  for (const Node* n : g.nodes()) {
    s += fmt::format("node {} {} '{}' in:", n->name(), n->op_type(), n->domain());
    for (const Value* v : n->inputs()) s += " " + (v ? v->name() : std::string("-"));
    s += " out:";
    for (const Value* v : n->outputs()) s += " " + (v ? v->name() : std::string("-"));
    for (const auto& [k, a] : n->attrs().all()) {
      s += fmt::format(" {}({})={}", k, ToString(KindOf(a)), Describe(a));
    }
    s += "\n";
  }
  for (const Value* v : g.inputs()) s += "input " + v->name() + "\n";
  for (const Value* v : g.outputs()) s += "output " + v->name() + "\n";
  for (const LayerDesc& l : e.layers) {
    s += fmt::format("layer {} {} {} [{}] {} {} {}\n", l.node->name(), l.provider_id, l.tactic.name,
                     fmt::join(l.tactic.params, ","), l.tactic.workspace_bytes, l.measured_ms,
                     l.precision_reason);
  }
  for (const InputProfile& p : e.profile.inputs) {
    s += fmt::format("profile {} [{}] [{}] [{}]\n", p.input, fmt::join(p.min, ","),
                     fmt::join(p.opt, ","), fmt::join(p.max, ","));
  }
  for (const auto& [name, off] : e.plan.offsets) s += fmt::format("offset {} {}\n", name, off);
  s += fmt::format("plan {} {} {} {}\n", e.plan.arena_bytes, e.plan.workspace_bytes,
                   e.plan.weights_bytes, e.plan.peak_bytes);
  s += "report " + e.build_report_json + "\n";
  return s;
}

TEST(EngineFile, RoundTripKeepsEverything) {
  auto chain = Chain();
  chain->layers[0].tactic.params = {8, 16};
  Bytes bytes = Serialize(*chain);
  auto loaded = LoadEngineBytes(bytes);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(Fingerprint(**loaded), Fingerprint(*chain));
  // Spot checks on what the fingerprint encodes, so a broken fingerprint cannot hide a bug.
  const Graph& g = *(*loaded)->graph;
  EXPECT_EQ(g.FindValue("x")->shape()[0], Dim::Symbol("batch"));
  EXPECT_EQ(g.FindValue("w")->constant()->ToFloatVector(),
            (std::vector<float>{-1.f, 0.5f, 2.f, -3.f}));
  const Node* relu1 = g.FindNode("relu1");
  ASSERT_NE(relu1, nullptr);
  EXPECT_EQ(relu1->attrs().GetInts("ints"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(relu1->attrs().GetTensor("t")->ToInt64Vector(), (std::vector<int64_t>{42, -42}));
  EXPECT_EQ((*loaded)->layers[1].provider_id, "test.add");
  EXPECT_EQ((*loaded)->layers[1].measured_ms, 0.125);
  EXPECT_EQ((*loaded)->plan.offsets.at("a"), chain->plan.offsets.at("a"));
  EXPECT_EQ((*loaded)->header.kiln_version, std::string(KilnVersion()));
  // And the loaded engine serializes to the very same bytes.
  EXPECT_EQ(Serialize(**loaded), bytes);
}

TEST(EngineFile, SymbolicPolynomialDimsRoundTrip) {
  auto g = std::make_unique<Graph>();
  Dim b = Dim::Symbol("batch"), s = Dim::Symbol("seq");
  Value* x = g->AddInput("x", DataType::kFloat16, {b, s * 2 + 1, b * s * 3 - 4, 0});
  Value* y = g->AddValue("y");
  g->AddNode("Relu", "r", {x}, {y});
  g->MarkOutput(y);
  OptimizationProfile p;
  p.inputs.push_back({"x", {1, 3, 0, 0}, {2, 5, 2, 0}, {4, 9, 100, 0}});
  auto e = testing::AssembleTestEngine(std::move(g), p);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  auto loaded = LoadEngineBytes(Serialize(**e));
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const Shape& shape = (*loaded)->graph->FindValue("y")->shape();
  ASSERT_EQ(shape.size(), 4u);
  EXPECT_EQ(shape[1], s * 2 + 1);
  EXPECT_EQ(shape[2], b * s * 3 - 4);
  EXPECT_EQ(shape[3], Dim(0));
  EXPECT_EQ((*loaded)->graph->FindValue("y")->dtype(), DataType::kFloat16);
}

TEST(EngineFile, SerializationIsDeterministic) {
  Bytes first = Serialize(*Chain());
  Bytes second = Serialize(*Chain());  // built again from scratch
  EXPECT_EQ(first, second);
  auto diamond = testing::AssembleTestEngine(testing::MakeDiamondGraph(), {});
  ASSERT_TRUE(diamond.ok());
  EXPECT_EQ(Serialize(**diamond), Serialize(**diamond));
  EXPECT_NE(Serialize(**diamond), first);
}

TEST(EngineFile, WritesAtomicallyAndMapsWeightsWithoutCopying) {
  auto dir =
      std::filesystem::temp_directory_path() / ("kiln_engine_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "chain.kiln").string();
  auto chain = Chain();
  ASSERT_TRUE(WriteEngineFile(*chain, path).ok());
  ASSERT_TRUE(WriteEngineFile(*chain, path).ok());                    // replaces the first one
  EXPECT_EQ(FileNames(dir), std::vector<std::string>{"chain.kiln"});  // no temporary left behind
  // The file is written as it is serialized (payload, then the preamble at offset 0), and its
  // bytes are exactly SerializeEngine's, for both engines.
  EXPECT_EQ(ReadFile(path), Serialize(*chain));
  auto diamond = testing::AssembleTestEngine(testing::MakeDiamondGraph(), {});
  ASSERT_TRUE(diamond.ok());
  const std::string diamond_path = (dir / "diamond.kiln").string();
  ASSERT_TRUE(WriteEngineFile(**diamond, diamond_path).ok());
  EXPECT_EQ(ReadFile(diamond_path), Serialize(**diamond));
  std::filesystem::remove(diamond_path);

  auto loaded = LoadEngineFile(path, {BackendKind::kCpu, "x86_64"});
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const Tensor* w = (*loaded)->graph->FindValue("w")->constant();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w->raw()) % 64, 0u);
  EXPECT_EQ(w->ToFloatVector(), (std::vector<float>{-1.f, 0.5f, 2.f, -3.f}));
  // Borrowed, not owned: the tensor's bytes are the file's bytes at the constant's offset.
  Bytes file = Serialize(*chain);
  const std::byte* mapped_w = static_cast<const std::byte*>(w->raw());
  EXPECT_EQ(std::memcmp(mapped_w, file.data() + file.size() - 64, 16), 0);

  auto missing = LoadEngineFile((dir / "nope.kiln").string());
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  std::filesystem::remove_all(dir);
}

TEST(EngineFile, AWriteThatFailsMidStreamKeepsTheOldEngineAndLeavesNoTemporary) {
  // A disk that fills up while the payload streams out, made with RLIMIT_FSIZE: writes past the
  // limit fail (EFBIG; SIGXFSZ ignored). The engine already at the path must survive untouched.
  auto dir =
      std::filesystem::temp_directory_path() / ("kiln_engine_full_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "model.kiln").string();
  auto diamond = testing::AssembleTestEngine(testing::MakeDiamondGraph(), {});
  ASSERT_TRUE(diamond.ok());
  ASSERT_TRUE(WriteEngineFile(**diamond, path).ok());
  const Bytes old = ReadFile(path);
  ASSERT_EQ(old, Serialize(**diamond));

  auto chain = Chain();
  const size_t size = Serialize(*chain).size();
  ASSERT_GT(size, kEnginePreambleBytes + 64);
  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  struct rlimit small = saved;
  small.rlim_cur = (kEnginePreambleBytes + size) / 2;  // inside the payload
  auto previous_handler = std::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  Status s = WriteEngineFile(*chain, path);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &saved), 0);
  std::signal(SIGXFSZ, previous_handler);

  EXPECT_EQ(s.code(), ErrorCode::kIoError) << s.ToString();
  EXPECT_NE(s.message().find("failed at byte"), std::string::npos) << s.ToString();
  EXPECT_EQ(ReadFile(path), old);  // the previous engine, byte for byte
  // The partial temporary is gone.
  EXPECT_EQ(FileNames(dir), std::vector<std::string>{"model.kiln"});
  // With room again the same write succeeds.
  ASSERT_TRUE(WriteEngineFile(*chain, path).ok());
  EXPECT_EQ(ReadFile(path), Serialize(*chain));
  std::filesystem::remove_all(dir);
}

TEST(EngineFile, SpecialFilesAreRefusedOnBothSides) {
  auto dir =
      std::filesystem::temp_directory_path() / ("kiln_engine_fifo_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string fifo = (dir / "pipe.kiln").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Loading from a FIFO with no writer would block in open(); it is refused at once.
  auto loaded = LoadEngineFile(fifo);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), ErrorCode::kNotRegularFile);
  // Writing over it (or over a link) is refused and leaves both in place.
  EXPECT_EQ(WriteEngineFile(*Chain(), fifo).code(), ErrorCode::kOutputNotRegular);
  const std::string target = (dir / "real.kiln").string();
  ASSERT_TRUE(WriteEngineFile(*Chain(), target).ok());
  std::filesystem::create_symlink(target, dir / "link.kiln");
  EXPECT_EQ(WriteEngineFile(*Chain(), (dir / "link.kiln").string()).code(),
            ErrorCode::kOutputNotRegular);
  EXPECT_TRUE(std::filesystem::is_fifo(fifo));
  EXPECT_TRUE(std::filesystem::is_symlink(dir / "link.kiln"));
  std::vector<std::string> names = FileNames(dir);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"link.kiln", "pipe.kiln", "real.kiln"}));
  std::filesystem::remove_all(dir);
}

TEST(EngineFile, RejectsWrongMagic) {
  Bytes b = Serialize(*Chain());
  EXPECT_EQ(LoadStatus({}).code(), ErrorCode::kEngineNotKiln);
  Bytes onnx(100, std::byte{0x08});
  EXPECT_EQ(LoadStatus(onnx).code(), ErrorCode::kEngineNotKiln);
  b[3] = std::byte{'M'};
  EXPECT_EQ(LoadStatus(b).code(), ErrorCode::kEngineNotKiln);
}

TEST(EngineFile, RejectsTruncationAtEveryStage) {
  Bytes b = Serialize(*Chain());
  auto pre = ReadEnginePreamble(b);
  ASSERT_TRUE(pre.ok());
  const size_t fb_end = kEnginePreambleBytes + pre->flatbuffer_bytes;
  for (size_t cut : {size_t{2}, size_t{40}, size_t{64}, size_t{65}, fb_end / 2, fb_end,
                     b.size() - 64, b.size() - 1}) {
    Bytes t(b.begin(), b.begin() + cut);
    Status s = LoadStatus(t);
    EXPECT_EQ(s.code(), ErrorCode::kEngineTruncated) << "cut at " << cut << ": " << s.ToString();
  }
  Bytes longer = b;
  longer.push_back(std::byte{0});
  EXPECT_EQ(LoadStatus(longer).code(), ErrorCode::kEngineMalformed);
}

TEST(EngineFile, FlippedBytesFailTheChecksum) {
  Bytes b = Serialize(*Chain());
  auto pre = ReadEnginePreamble(b);
  ASSERT_TRUE(pre.ok());
  for (size_t at : {kEnginePreambleBytes + 8,                          // FlatBuffer header
                    kEnginePreambleBytes + pre->flatbuffer_bytes / 2,  // graph
                    b.size() - 60}) {                                  // weights
    Bytes f = b;
    f[at] ^= std::byte{0x10};
    Status s = LoadStatus(f);
    EXPECT_EQ(s.code(), ErrorCode::kEngineChecksum) << "flip at " << at << ": " << s.ToString();
  }
  Bytes f = b;
  f[33] ^= std::byte{1};  // the recorded checksum itself
  EXPECT_EQ(LoadStatus(f).code(), ErrorCode::kEngineChecksum);
}

TEST(EngineFile, ChecksumCoversTheWholePreamble) {
  const Bytes b = Serialize(*Chain());
  ASSERT_TRUE(LoadStatus(b).ok());
  // Every preamble byte outside the checksum itself: version, sizes, flags, the kiln version
  // text (bytes 48..63, NUL padding included).
  for (size_t at = 4; at < kEnginePreambleBytes; ++at) {
    if (at >= 32 && at < 48) continue;
    for (std::byte bit : {std::byte{0x01}, std::byte{0x80}}) {
      Bytes f = b;
      f[at] ^= bit;
      Status s = LoadStatus(f);
      EXPECT_NE(s.code(), ErrorCode::kOk) << "flip at " << at;
      if (at >= 8 && at < 32) continue;  // sizes may be caught as truncation first
      EXPECT_EQ(s.code(), ErrorCode::kEngineChecksum) << "flip at " << at << ": " << s.ToString();
    }
  }
}

TEST(EngineFile, FormatOneFilesAskForARebuild) {
  // A format-1 file: the same layout, its checksum over the payload only.
  Bytes b = Serialize(*Chain());
  auto pre = ReadEnginePreamble(b);
  ASSERT_TRUE(pre.ok());
  pre->format_version = 1;
  pre->checksum = HashBytes(std::span(b).subspan(kEnginePreambleBytes));
  WriteEnginePreamble(*pre, b);
  Status s = LoadStatus(b);
  EXPECT_EQ(s.code(), ErrorCode::kEngineVersionTooOld) << s.ToString();
  EXPECT_NE(s.message().find("format version 1"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("rebuild"), std::string::npos) << s.message();
  // A current file whose version byte was changed to 1 is corrupt, not old.
  Bytes f = Serialize(*Chain());
  f[4] = std::byte{1};
  EXPECT_EQ(LoadStatus(f).code(), ErrorCode::kEngineChecksum);
}

TEST(EngineFile, NewerFormatNamesTheVersionNeeded) {
  Bytes b = Serialize(*Chain());
  auto pre = ReadEnginePreamble(b);
  pre->format_version = kEngineFormatVersion + 1;
  pre->kiln_version = "9.4.2";
  WriteEnginePreamble(*pre, b);
  Reseal(b);  // a newer kiln seals its files by the same rule
  Status s = LoadStatus(b);
  EXPECT_EQ(s.code(), ErrorCode::kEngineVersionTooNew);
  EXPECT_NE(s.message().find(fmt::format("format version {}", kEngineFormatVersion + 1)),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("kiln 9.4.2 or newer"), std::string::npos) << s.message();
}

TEST(EngineFile, ForeignTargetNamesBothTargets) {
  Bytes b = Serialize(*Chain());
  Status arch = LoadStatus(b, {BackendKind::kCpu, "aarch64"});
  EXPECT_EQ(arch.code(), ErrorCode::kEngineTargetMismatch);
  EXPECT_NE(arch.message().find("'x86_64'"), std::string::npos) << arch.message();
  EXPECT_NE(arch.message().find("'aarch64'"), std::string::npos) << arch.message();
  Status backend = LoadStatus(b, {BackendKind::kCuda, std::nullopt});
  EXPECT_EQ(backend.code(), ErrorCode::kEngineTargetMismatch);
  EXPECT_NE(backend.message().find("backend 'cpu'"), std::string::npos);
  EXPECT_NE(backend.message().find("backend 'cuda'"), std::string::npos);
  EngineHeader h;
  h.backend = BackendKind::kCuda;
  h.device_arch = "sm_90";
  EXPECT_EQ(CheckEngineTarget(h, BackendKind::kCuda, "sm_80").code(),
            ErrorCode::kEngineTargetMismatch);
  EXPECT_TRUE(CheckEngineTarget(h, BackendKind::kCuda, "sm_90").ok());
}

// Each edit passes the checksum (resealed) and must be caught by the bounds checks with the
// field named.
struct Craft {
  const char* name;
  std::function<bool(fb::Engine*, Bytes&)> edit;  // false: the edit could not be applied
  const char* expected_text;
};

TEST(EngineFile, CraftedFilesAreCaughtByBoundsChecks) {
  const Bytes original = Serialize(*Chain());
  auto graph = [](fb::Engine* e) { return e->mutable_graph(); };
  auto constant = [&](fb::Engine* e) { return graph(e)->mutable_constants()->GetMutableObject(0); };
  std::vector<Craft> crafts = {
      {"weight offset past the end",
       [&](fb::Engine* e, Bytes&) { return constant(e)->mutate_offset(1 << 20); },
       "graph.constants[0]"},
      {"weight offset overflowing",
       [&](fb::Engine* e, Bytes&) { return constant(e)->mutate_offset(~uint64_t{63}); },
       "graph.constants[0]"},
      {"weight length differs from dims",
       [&](fb::Engine* e, Bytes&) { return constant(e)->mutate_length(8); }, "length 8"},
      {"negative constant dim",
       [&](fb::Engine* e, Bytes&) {
         constant(e)->mutable_dims()->Mutate(0, -4);
         return true;
       },
       "graph.constants[0]"},
      {"element count overflow",
       [&](fb::Engine* e, Bytes&) {
         constant(e)->mutable_dims()->Mutate(0, int64_t{1} << 62);
         return true;
       },
       "graph.constants[0]"},
      {"constant dtype out of range",
       [&](fb::Engine* e, Bytes&) { return constant(e)->mutate_dtype(200); }, "dtype 200"},
      {"value dtype out of range",
       [&](fb::Engine* e, Bytes&) {
         return graph(e)->mutable_values()->GetMutableObject(0)->mutate_dtype(99);
       },
       "dtype 99"},
      {"node input index out of range",
       [&](fb::Engine* e, Bytes&) {
         graph(e)->mutable_nodes()->GetMutableObject(0)->mutable_inputs()->Mutate(0, 999);
         return true;
       },
       "input value index 999"},
      {"node output index negative",
       [&](fb::Engine* e, Bytes&) {
         graph(e)->mutable_nodes()->GetMutableObject(0)->mutable_outputs()->Mutate(0, -7);
         return true;
       },
       "output value index -7"},
      {"graph output index out of range",
       [&](fb::Engine* e, Bytes&) {
         graph(e)->mutable_outputs()->Mutate(0, 12345);
         return true;
       },
       "graph.outputs"},
      {"unknown op type",
       [&](fb::Engine* e, Bytes&) {
         auto* op = graph(e)->mutable_nodes()->GetMutableObject(0)->mutable_op_type();
         op->Mutate(3, 'v');  // Relu -> Relv
         return true;
       },
       "op type 'Relv'"},
      {"unknown provider",
       [&](fb::Engine* e, Bytes&) {
         e->mutable_layers()->GetMutableObject(0)->mutable_provider_id()->Mutate(0, 'X');
         return true;
       },
       "is not registered for backend 'cpu'"},
      {"layer node index out of range",
       [&](fb::Engine* e, Bytes&) {
         return e->mutable_layers()->GetMutableObject(0)->mutate_node(77);
       },
       "layers[0]"},
      {"layers out of order",
       [&](fb::Engine* e, Bytes&) {
         auto* layers = e->mutable_layers();
         int32_t first = layers->Get(0)->node();
         return layers->GetMutableObject(0)->mutate_node(layers->Get(2)->node()) &&
                layers->GetMutableObject(2)->mutate_node(first);
       },
       "before any earlier layer produces it"},
      {"plan offset outside the arena",
       [&](fb::Engine* e, Bytes&) {
         return e->mutable_plan()->mutable_offsets()->GetMutableObject(0)->mutate_offset(1 << 30);
       },
       "outside the"},
      {"plan offset misaligned",
       [&](fb::Engine* e, Bytes&) {
         return e->mutable_plan()->mutable_offsets()->GetMutableObject(0)->mutate_offset(6);
       },
       "not 64-byte aligned"},
      {"profile min above max",
       [&](fb::Engine* e, Bytes&) {
         e->mutable_profile()->GetMutableObject(0)->mutable_min()->Mutate(0, 100);
         return true;
       },
       "profile[0]"},
      {"backend out of range",
       [&](fb::Engine* e, Bytes&) { return e->mutable_header()->mutate_backend(9); },
       "header.backend"},
      {"FlatBuffer root offset garbage",
       [&](fb::Engine*, Bytes& b) {
         b[kEnginePreambleBytes] = std::byte{0xff};
         b[kEnginePreambleBytes + 1] = std::byte{0xff};
         return true;
       },
       "fails verification"},
      {"FlatBuffer length beyond the payload",
       [&](fb::Engine*, Bytes& b) {
         auto p = ReadEnginePreamble(b);
         p->flatbuffer_bytes = p->payload_bytes + 1;
         WriteEnginePreamble(*p, b);
         return true;
       },
       "larger than the payload"},
  };
  for (const Craft& c : crafts) {
    Bytes b = original;
    ASSERT_TRUE(c.edit(Mutable(b), b)) << c.name << ": the field is not in the buffer";
    Reseal(b);
    Status s = LoadStatus(b);
    EXPECT_EQ(s.code(), ErrorCode::kEngineMalformed) << c.name << ": " << s.ToString();
    EXPECT_NE(s.message().find(c.expected_text), std::string::npos)
        << c.name << ": " << s.message();
  }
}

// The chain engine with a weight program that makes its constant w from initializer "w_init"
// (as a build records it): what StripWeights needs.
std::unique_ptr<EngineDesc> ChainWithProgram() {
  auto e = Chain();
  WeightProgram& p = e->weight_program;
  p.recorded = true;
  p.sources.push_back({"w_init", DataType::kFloat32, {4}});
  p.targets.push_back({"w", 0});
  return e;
}

std::unique_ptr<EngineDesc> StrippedChain() {
  auto e = ChainWithProgram();
  Status s = StripWeights(*e);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return e;
}

TEST(StrippedEngine, OmitsTheProgramsConstantsAndSaysSoInPreambleAndHeader) {
  const Bytes full = Serialize(*ChainWithProgram());
  const Bytes stripped = Serialize(*StrippedChain());
  // w (16 bytes) was the only weight: its aligned 64 bytes are gone, and nothing else changed
  // size but the two flags and the constant's `absent`.
  auto full_pre = ReadEnginePreamble(full);
  auto pre = ReadEnginePreamble(stripped);
  ASSERT_TRUE(full_pre.ok() && pre.ok());
  EXPECT_EQ(full_pre->flags, 0u);
  EXPECT_EQ(pre->flags, kEngineFlagWeightsStripped);
  EXPECT_EQ(full.size() - (kEnginePreambleBytes + full_pre->flatbuffer_bytes + 63) / 64 * 64, 64u);
  EXPECT_EQ(stripped.size(), (kEnginePreambleBytes + pre->flatbuffer_bytes + 63) / 64 * 64);

  auto loaded = LoadEngineBytes(stripped);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_TRUE((*loaded)->header.weights_stripped);
  const Value* w = (*loaded)->graph->FindValue("w");
  ASSERT_TRUE(w && w->is_constant());
  EXPECT_EQ(w->constant()->dtype(), DataType::kFloat32);
  EXPECT_EQ(w->constant()->dims(), (std::vector<int64_t>{4}));
  EXPECT_EQ(w->constant()->raw(), nullptr);
  EXPECT_EQ(AbsentConstants(**loaded), (std::vector<std::string>{"w"}));
  EXPECT_EQ((*loaded)->weight_program.sources.front().name, "w_init");
  // The loaded stripped engine serializes to the same bytes; the full one is unchanged.
  EXPECT_EQ(Serialize(**loaded), stripped);
  EXPECT_EQ(Fingerprint(**loaded), Fingerprint(*StrippedChain()));
  auto full_loaded = LoadEngineBytes(full);
  ASSERT_TRUE(full_loaded.ok());
  EXPECT_FALSE((*full_loaded)->header.weights_stripped);
  EXPECT_TRUE(AbsentConstants(**full_loaded).empty());
}

TEST(StrippedEngine, StrippingTwiceChangesNothing) {
  auto e = StrippedChain();
  const Bytes once = Serialize(*e);
  ASSERT_TRUE(StripWeights(*e).ok());
  EXPECT_EQ(Serialize(*e), once);
}

TEST(StrippedEngine, TheSerializationOptionWritesTheSameBytesAndKeepsTheEngine) {
  auto full = ChainWithProgram();
  const Bytes before = Serialize(*full);
  auto bytes = SerializeEngine(*full, {.strip_weights = true});
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  EXPECT_EQ(*bytes, Serialize(*StrippedChain()));
  EXPECT_FALSE(full->header.weights_stripped);
  EXPECT_EQ(Serialize(*full), before);  // the engine itself keeps its weights
  auto none = Chain();
  EXPECT_EQ(SerializeEngine(*none, {.strip_weights = true}).status().code(),
            ErrorCode::kRefitNotRecorded);
}

TEST(StrippedEngine, AnEngineRefitCouldNotFillIsNotStripped) {
  auto none = Chain();  // no weight program
  Status s = StripWeights(*none);
  EXPECT_EQ(s.code(), ErrorCode::kRefitNotRecorded) << s.ToString();
  EXPECT_FALSE(none->header.weights_stripped);
  auto unfit = ChainWithProgram();
  unfit->weight_program.targets.clear();
  unfit->weight_program.non_refittable.push_back({"w", "made by code that records no step"});
  s = StripWeights(*unfit);
  EXPECT_EQ(s.code(), ErrorCode::kRefitNotRefittable) << s.ToString();
  EXPECT_NE(s.message().find("'w'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("without --strip-weights"), std::string::npos) << s.message();
  EXPECT_FALSE(unfit->header.weights_stripped);
  // Nothing was dropped: w keeps its bytes.
  EXPECT_EQ(unfit->graph->FindValue("w")->constant()->ToFloatVector(),
            (std::vector<float>{-1.f, 0.5f, 2.f, -3.f}));
}

TEST(StrippedEngine, TruncatedOrFlippedStrippedFilesAreRejected) {
  const Bytes b = Serialize(*StrippedChain());
  for (size_t cut : {size_t{2}, size_t{63}, size_t{64}, b.size() / 2, b.size() - 1}) {
    Bytes t(b.begin(), b.begin() + cut);
    Status s = LoadStatus(t);
    EXPECT_EQ(s.code(), ErrorCode::kEngineTruncated) << "cut at " << cut << ": " << s.ToString();
  }
  for (size_t at : {size_t{12}, kEnginePreambleBytes + 8, b.size() - 8}) {
    Bytes f = b;
    f[at] ^= std::byte{0x10};
    EXPECT_EQ(LoadStatus(f).code(), ErrorCode::kEngineChecksum) << "flipped at " << at;
  }
}

TEST(StrippedEngine, InconsistentStrippingIsMalformed) {
  const Bytes stripped = Serialize(*StrippedChain());
  const Bytes full = Serialize(*ChainWithProgram());
  auto constant = [](fb::Engine* e) {
    return e->mutable_graph()->mutable_constants()->GetMutableObject(0);
  };
  auto set_flags = [](Bytes& b, uint32_t flags) {
    auto p = ReadEnginePreamble(b);
    p->flags = flags;
    WriteEnginePreamble(*p, b);
    return true;
  };
  struct Case {
    const char* name;
    const Bytes* base;
    std::function<bool(fb::Engine*, Bytes&)> edit;
    const char* expected_text;
  };
  const std::vector<Case> cases = {
      {"preamble flag cleared on a stripped file", &stripped,
       [&](fb::Engine*, Bytes& b) { return set_flags(b, 0); }, "header.weights_stripped is true"},
      {"preamble flag set on a full file", &full,
       [&](fb::Engine*, Bytes& b) { return set_flags(b, kEngineFlagWeightsStripped); },
       "header.weights_stripped is false"},
      {"an unknown flag", &stripped,
       [&](fb::Engine*, Bytes& b) { return set_flags(b, kEngineFlagWeightsStripped | 4); },
       "flags 0x5"},
      {"header says full, flag says stripped", &stripped,
       [&](fb::Engine* e, Bytes&) { return e->mutable_header()->mutate_weights_stripped(false); },
       "header.weights_stripped is false"},
      {"an absent constant in a full engine", &full,
       [&](fb::Engine* e, Bytes&) { return constant(e)->mutate_absent(true); }, "is not stripped"},
      {"an absent constant with an offset", &stripped,
       [&](fb::Engine* e, Bytes&) { return constant(e)->mutate_offset(64); }, "offset 64"},
      {"an absent constant whose length differs from its dims", &stripped,
       [&](fb::Engine* e, Bytes&) { return constant(e)->mutate_length(1 << 20); },
       "does not match its dims"},
      {"a program target present in a stripped engine", &stripped,
       [&](fb::Engine* e, Bytes&) { return constant(e)->mutate_absent(false); },
       "graph.constants[0]"},
      {"a program target that is not a constant", &stripped,
       [&](fb::Engine* e, Bytes&) {
         // The target names another value (x, an input): the program's check names it.
         return e->mutable_weight_program()->mutable_targets()->GetMutableObject(0)->mutate_value(
             0);
       },
       "weight_program.targets[0]"},
  };
  for (const Case& c : cases) {
    Bytes b = *c.base;
    ASSERT_TRUE(c.edit(Mutable(b), b)) << c.name << ": the field is not in the buffer";
    Reseal(b);
    Status s = LoadStatus(b);
    EXPECT_EQ(s.code(), ErrorCode::kEngineMalformed) << c.name << ": " << s.ToString();
    EXPECT_NE(s.message().find(c.expected_text), std::string::npos)
        << c.name << ": " << s.message();
  }
}

TEST(StrippedEngine, AbsentConstantsMustBeExactlyTheProgramsTargets) {
  // x[2,4] -> Add(x, w) -> Add(., v) -> y: w is made from an initializer, v is a literal.
  auto g = std::make_unique<Graph>();
  Value* x = g->AddInput("x", DataType::kFloat32, {2, 4});
  Value* w = g->AddConstant("w", Tensor::FromVector<float>(DataType::kFloat32, {4}, {1, 2, 3, 4}));
  Value* v = g->AddConstant("v", Tensor::FromVector<float>(DataType::kFloat32, {4}, {5, 6, 7, 8}));
  Value* a = g->AddValue("a");
  Value* y = g->AddValue("y");
  g->AddNode("Add", "add_w", {x, w}, {a});
  g->AddNode("Add", "add_v", {a, v}, {y});
  g->MarkOutput(y);
  auto e = testing::AssembleTestEngine(std::move(g), {});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  (*e)->weight_program.recorded = true;
  (*e)->weight_program.sources.push_back({"w_init", DataType::kFloat32, {4}});
  (*e)->weight_program.targets.push_back({"w", 0});
  ASSERT_TRUE(StripWeights(**e).ok());
  Bytes b = Serialize(**e);
  auto loaded = LoadEngineBytes(b);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ((*loaded)->graph->FindValue("w")->constant()->raw(), nullptr);
  EXPECT_EQ((*loaded)->graph->FindValue("v")->constant()->ToFloatVector(),
            (std::vector<float>{5, 6, 7, 8}));  // the literal stays
  // The program's target moved to the literal v: v is present but made, w absent but not made.
  fb::Engine* fe = Mutable(b);
  const auto* values = fe->graph()->values();
  int32_t v_index = -1;
  for (uint32_t i = 0; i < values->size(); ++i) {
    if (values->Get(i)->name()->str() == "v") v_index = static_cast<int32_t>(i);
  }
  ASSERT_GE(v_index, 0);
  ASSERT_TRUE(
      fe->mutable_weight_program()->mutable_targets()->GetMutableObject(0)->mutate_value(v_index));
  Reseal(b);
  Status s = LoadStatus(b);
  EXPECT_EQ(s.code(), ErrorCode::kEngineMalformed) << s.ToString();
  EXPECT_NE(s.message().find("constant 'w' is absent but the weight program does not make it"),
            std::string::npos)
      << s.message();
}

// The fuzzer's seed corpus: small real engines. Written to $KILN_ENGINE_SEED_DIR when set (see
// fuzz/CMakeLists.engine.cmake), else to a temporary directory; each seed must load back.
TEST(EngineFile, FuzzSeedsAreRealLoadableEngines) {
  const char* env = std::getenv("KILN_ENGINE_SEED_DIR");
  std::filesystem::path dir = env && *env ? std::filesystem::path(env)
                                          : std::filesystem::temp_directory_path() /
                                                ("kiln_seeds_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::vector<std::pair<std::string, std::unique_ptr<EngineDesc>>> seeds;
  seeds.emplace_back("chain.kiln", Chain());
  auto diamond = testing::AssembleTestEngine(testing::MakeDiamondGraph(), {});
  ASSERT_TRUE(diamond.ok());
  seeds.emplace_back("diamond.kiln", std::move(*diamond));
  auto ws = testing::AssembleTestEngine(testing::MakeWorkspaceGraph(), testing::WorkspaceProfile());
  ASSERT_TRUE(ws.ok());
  seeds.emplace_back("workspace.kiln", std::move(*ws));
  seeds.emplace_back("chain_stripped.kiln", StrippedChain());
  for (const auto& [name, desc] : seeds) {
    const std::string path = (dir / name).string();
    ASSERT_TRUE(WriteEngineFile(*desc, path).ok());
    auto loaded = LoadEngineFile(path);
    ASSERT_TRUE(loaded.ok()) << name << ": " << loaded.status().ToString();
    EXPECT_EQ(Fingerprint(**loaded), Fingerprint(*desc)) << name;
  }
  if (!(env && *env)) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kiln
