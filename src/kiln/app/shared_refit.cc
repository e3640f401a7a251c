// RefitShared (shared_refit.h): one exchange of who holds what, then either a local refit on every
// rank or one broadcast of the changed constants from the lowest rank that holds the weights.
#include "kiln/app/shared_refit.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cstring>

#include "kiln/core/json_writer.h"

namespace kiln::app {
namespace {

using distributed::Clock;

// What each rank tells the others first: the weights it runs now and the ones it brings.
constexpr size_t kHexBytes = 32;
struct Hello {
  std::string running;  // HashString(the running weights' model hash), hex
  bool holds = false;
  std::string bringing;  // HashString(the new weights' model hash), hex; "" without weights
};

std::vector<std::byte> EncodeHello(const Hello& h) {
  std::vector<std::byte> out(2 * kHexBytes + 1, std::byte{0});
  std::memcpy(out.data(), h.running.data(), kHexBytes);
  out[kHexBytes] = std::byte{h.holds ? uint8_t{1} : uint8_t{0}};
  if (h.holds) std::memcpy(out.data() + kHexBytes + 1, h.bringing.data(), kHexBytes);
  return out;
}

std::vector<Hello> DecodeHellos(const std::vector<std::byte>& all, int ranks) {
  const size_t size = 2 * kHexBytes + 1;
  std::vector<Hello> out(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    const char* p = reinterpret_cast<const char*>(all.data() + r * size);
    out[r].running.assign(p, kHexBytes);
    out[r].holds = p[kHexBytes] != 0;
    if (out[r].holds) out[r].bringing.assign(p + kHexBytes + 1, kHexBytes);
  }
  return out;
}

// The broadcast payload: the new model hash, how many constants the refit made, and the changed
// ones (name, dtype, dims, bytes).
class Writer {
 public:
  void U64(uint64_t v) { Raw(&v, sizeof v); }
  void Text(const std::string& s) {
    U64(s.size());
    Raw(s.data(), s.size());
  }
  void Raw(const void* p, size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  std::vector<std::byte> Take() { return std::move(out_); }

 private:
  std::vector<std::byte> out_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}
  bool U64(uint64_t* v) { return Raw(v, sizeof *v); }
  bool Text(std::string* s) {
    uint64_t n = 0;
    if (!U64(&n) || n > in_.size() - pos_) return false;
    s->assign(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  bool Raw(void* p, size_t n) {
    if (n > in_.size() - pos_) return false;
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  std::span<const std::byte> Take(size_t n) {
    if (n > in_.size() - pos_) return {};
    auto s = in_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  bool done() const { return pos_ == in_.size(); }

 private:
  std::span<const std::byte> in_;
  size_t pos_ = 0;
};

std::vector<std::byte> EncodeConstants(const std::string& model_hash, size_t total,
                                       const std::map<std::string, Tensor>& changed) {
  Writer w;
  w.Text(model_hash);
  w.U64(total);
  w.U64(changed.size());
  for (const auto& [name, t] : changed) {
    w.Text(name);
    w.U64(static_cast<uint64_t>(t.dtype()));
    w.U64(t.dims().size());
    for (int64_t d : t.dims()) w.U64(static_cast<uint64_t>(d));
    w.U64(t.size_bytes());
    w.Raw(t.raw(), t.size_bytes());
  }
  return w.Take();
}

struct Received {
  std::string model_hash;
  uint64_t total = 0;
  std::map<std::string, Tensor> changed;
};

StatusOr<Received> DecodeConstants(std::span<const std::byte> payload, int source) {
  auto corrupt = [&](std::string_view what) {
    return MakeError(ErrorCode::kTransferCorrupt,
                     "the refit weights received from rank {} are malformed ({})", source, what);
  };
  Reader r(payload);
  Received out;
  uint64_t count = 0;
  if (!r.Text(&out.model_hash) || !r.U64(&out.total) || !r.U64(&count)) return corrupt("header");
  for (uint64_t i = 0; i < count; ++i) {
    std::string name;
    uint64_t dtype = 0, ndim = 0, bytes = 0;
    if (!r.Text(&name) || !r.U64(&dtype) || !r.U64(&ndim) || ndim > 64) return corrupt("a name");
    std::vector<int64_t> dims(ndim);
    for (int64_t& d : dims) {
      uint64_t v = 0;
      if (!r.U64(&v)) return corrupt("dims");
      d = static_cast<int64_t>(v);
    }
    if (!r.U64(&bytes)) return corrupt("a size");
    std::span<const std::byte> data = r.Take(bytes);
    if (data.size() != bytes) return corrupt("the bytes of '" + name + "'");
    Tensor t = Tensor::FromBytes(static_cast<DataType>(dtype), std::move(dims), data);
    if (t.size_bytes() != bytes) return corrupt("the size of '" + name + "'");
    out.changed.emplace(std::move(name), std::move(t));
  }
  if (!r.done()) return corrupt("trailing bytes");
  return out;
}

// Ranks whose `field` differs from the first rank's, as "rank 1 (hash ...)".
std::string Differing(const std::vector<Hello>& hellos, const std::vector<int>& ranks,
                      std::string Hello::*field) {
  std::vector<std::string> out;
  for (int r : ranks) {
    out.push_back(fmt::format("rank {} {}", r, (hellos[r].*field).substr(0, 12)));
  }
  return fmt::format("{}", fmt::join(out, ", "));
}

// The header root broadcasts first: its result (0 or a catalog number), the payload's size and
// its checksum.
struct Header {
  uint64_t code = 0;
  uint64_t size = 0;
  Hash128 checksum;
};

}  // namespace

std::string SharedRefitReport::ToJson() const {
  JsonWriter w;
  w.BeginObject();
  w.Key("mode").String(mode);
  w.Key("rank").Int(rank);
  w.Key("world_size").Int(world_size);
  w.Key("source").Int(source);
  w.Key("holders").BeginArray();
  for (int h : holders) w.Int(h);
  w.EndArray();
  w.Key("constants_sent").Int(constants_sent);
  w.Key("constants_unchanged").Int(constants_unchanged);
  w.Key("bytes_sent").Int(bytes_sent);
  w.Key("generation").Int(static_cast<int64_t>(generation));
  w.Key("seconds").Double(seconds);
  w.EndObject();
  std::string json = w.Take();
  // The refit's own report (on ranks that computed it) as a nested object.
  json.insert(json.size() - 1, ",\n  \"refit\": " + refit.ToJson());
  return json;
}

StatusOr<SharedRefitReport> RefitShared(LiveEngine& engine, const SharedRefitWeights* weights,
                                        distributed::Communicator& comm, double timeout_s) {
  const auto start = Clock::now();
  auto deadline = [&] {
    return Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  };
  SharedRefitReport rep;
  rep.rank = comm.rank();
  rep.world_size = comm.size();

  Hello mine{HashString(engine.model_hash()).Hex(), weights != nullptr,
             weights ? HashString(weights->model_hash.Hex()).Hex() : std::string()};
  KILN_ASSIGN_OR_RETURN(auto all, comm.AllGather(EncodeHello(mine), deadline(), "refit hello"));
  const std::vector<Hello> hellos = DecodeHellos(all, comm.size());
  std::vector<int> ranks(static_cast<size_t>(comm.size()));
  for (int r = 0; r < comm.size(); ++r) ranks[r] = r;
  for (const Hello& h : hellos) {
    if (h.running != hellos[0].running) {
      return MakeError(ErrorCode::kRefitRanksDiffer,
                       "the ranks' engines run different weights before this refit (running "
                       "weights' hashes: {})",
                       Differing(hellos, ranks, &Hello::running));
    }
  }
  for (int r = 0; r < comm.size(); ++r) {
    if (hellos[r].holds) rep.holders.push_back(r);
  }
  if (rep.holders.empty()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "no rank of the {} passed the new weights: at least one must", comm.size());
  }
  for (int r : rep.holders) {
    if (hellos[r].bringing != hellos[rep.holders.front()].bringing) {
      return MakeError(ErrorCode::kRefitRanksDiffer,
                       "the ranks that pass new weights pass different ones (weights' hashes: {})",
                       Differing(hellos, rep.holders, &Hello::bringing));
    }
  }

  if (rep.holders.size() == static_cast<size_t>(comm.size())) {
    // Every rank holds the weights: each refits on its own (the same check and replay everywhere,
    // so an error is every rank's), and nothing crosses the group.
    rep.mode = "local";
    KILN_ASSIGN_OR_RETURN(rep.generation,
                          engine.Refit(weights->initializers, weights->model_hash, &rep.refit));
    rep.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return rep;
  }

  rep.mode = "relay";
  rep.source = rep.holders.front();
  const bool source = comm.rank() == rep.source;
  Status computed = OkStatus();
  std::map<std::string, Tensor> constants;
  std::vector<std::byte> payload;
  Header header;
  if (source) {
    auto c = engine.Compute(weights->initializers, &rep.refit);
    if (c.ok()) {
      constants = std::move(*c);
      std::map<std::string, Tensor> changed = engine.Changed(constants);
      rep.constants_sent = static_cast<int64_t>(changed.size());
      rep.constants_unchanged = static_cast<int64_t>(constants.size() - changed.size());
      payload = EncodeConstants(weights->model_hash.Hex(), constants.size(), changed);
    } else {
      computed = c.status();
      std::string text = computed.message();
      for (const std::string& line : computed.context()) text += "; " + line;
      payload.assign(reinterpret_cast<const std::byte*>(text.data()),
                     reinterpret_cast<const std::byte*>(text.data() + text.size()));
      header.code = static_cast<uint64_t>(LookupError(computed.code()).number);
    }
    header.size = payload.size();
    header.checksum = HashBytes(payload);
  }
  KILN_RETURN_IF_ERROR(comm.Broadcast(std::as_writable_bytes(std::span(&header, 1)), rep.source,
                                      deadline(), "refit header"));
  payload.resize(header.size);
  KILN_RETURN_IF_ERROR(comm.Broadcast(payload, rep.source, deadline(), "refit weights"));
  rep.bytes_sent = static_cast<int64_t>(payload.size());
  if (header.code != 0) {
    if (source) return computed;
    const ErrorInfo* info = FindError(std::to_string(header.code));
    std::string text(reinterpret_cast<const char*>(payload.data()), payload.size());
    return Status(info ? info->code : ErrorCode::kInternal, text)
        .AddContext(fmt::format("on rank {}, which computed the refit for the group", rep.source));
  }
  if (HashBytes(payload) != header.checksum) {
    return MakeError(ErrorCode::kTransferCorrupt,
                     "the refit weights received from rank {} do not match its checksum",
                     rep.source);
  }
  if (source) {
    KILN_ASSIGN_OR_RETURN(rep.generation, engine.Publish(constants, weights->model_hash.Hex()));
  } else {
    KILN_ASSIGN_OR_RETURN(Received got, DecodeConstants(payload, rep.source));
    rep.constants_sent = static_cast<int64_t>(got.changed.size());
    rep.constants_unchanged = static_cast<int64_t>(got.total - got.changed.size());
    KILN_ASSIGN_OR_RETURN(rep.generation, engine.Publish(got.changed, got.model_hash));
  }
  rep.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return rep;
}

}  // namespace kiln::app
