// BuildOnce in phases: elect (rank exchange, consistency checks, groups by --build-on), then
// build (the leader: one build or cache read per group, and a header that carries its success or
// error) or receive (the others: a bounded wait for that header), relay (the bytes), and report
// (a final exchange of per-rank timings).
#include "kiln/distributed/build_once.h"

#include <nlohmann/json.hpp>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <set>
#include <thread>

#include "kiln/core/hash.h"
#include "kiln/core/logging.h"
#include "kiln/distributed/mpi_comm.h"
#include "kiln/distributed/tcp_exchange.h"

namespace kiln::distributed {
namespace {

// What each rank tells the others at the start. Fixed size, so it can travel as raw bytes.
struct HelloRecord {
  int32_t claimed_rank;
  int32_t claimed_world;
  int32_t local_rank;
  int32_t transport_rank;
  int64_t pid;
  char host[64];
  char node[64];
  char arch[32];
  char key[33];
  char pad[7];
};

struct ResultHeader {
  int32_t code;  // ErrorCode number of the builder's failure, 0 when it succeeded
  int32_t outcome;
  uint64_t size;
  uint64_t hash_high;
  uint64_t hash_low;
  double build_s;
  char message[472];
};

enum Role : int32_t { kReceived = 0, kBuilt = 1, kCacheHit = 2, kTookOver = 3 };
// A ResultHeader whose outcome is kInProgress is a heartbeat: `message` is the build's latest
// progress line, and the result follows in a later header.
constexpr int32_t kInProgress = -1;
constexpr const char* kRoleNames[] = {"received", "built", "cache-hit", "took-over"};

struct StatsRecord {
  int32_t rank;
  int32_t role;
  double wait_s;
  double transfer_s;
  double build_s;
  double bulk_setup_s;
};

// How one rank's bulk-transport set-up (NCCL communicator init) went, shared with its group.
struct SetupOutcome {
  int32_t rank;
  int32_t code;  // 0: ready, else the ErrorCode
  double seconds;
  char message[240];
};

template <size_t N>
void CopyText(char (&dst)[N], std::string_view src) {
  std::memset(dst, 0, N);
  std::memcpy(dst, src.data(), std::min(src.size(), N - 1));
}

std::string Text(const char* s, size_t n) { return std::string(s, strnlen(s, n)); }

template <typename T>
std::span<const std::byte> AsBytes(const T& v) {
  return std::as_bytes(std::span(&v, 1));
}

template <typename T>
std::vector<T> Unpack(const std::vector<std::byte>& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

std::string Who(const HelloRecord& h) {
  return fmt::format("rank {} (host {}, pid {})", h.claimed_rank, Text(h.host, sizeof(h.host)),
                     h.pid);
}

// After the bulk transport's set-up: every rank of the group says how its own went, within
// `deadline`. Every rank then fails alike when any failed, naming the ranks and their reasons; a
// rank that never reports (stuck in the set-up, say in ncclCommInitRank, or gone) is named by the
// communicator's own bounded-wait error.
Status ShareSetupOutcome(Communicator& group, const Status& mine, double seconds,
                         Deadline deadline) {
  SetupOutcome out{};
  out.rank = group.rank();
  out.code = mine.ok() ? 0 : static_cast<int32_t>(mine.code());
  out.seconds = seconds;
  CopyText(out.message, mine.ok() ? std::string_view() : std::string_view(mine.message()));
  StatusOr<std::vector<std::byte>> all =
      group.AllGather(AsBytes(out), deadline, "report of the NCCL communicator set-up");
  if (!all.ok()) {
    return MakeError(
        ErrorCode::kCommInitTimeout, "the NCCL communicator was not set up on every rank: {}{}",
        all.status().message(),
        mine.ok() ? std::string()
                  : fmt::format(" (this rank after {:.2f} s: {})", seconds, mine.message()));
  }
  std::vector<SetupOutcome> failed;
  for (const SetupOutcome& o : Unpack<SetupOutcome>(*all)) {
    if (o.code != 0) failed.push_back(o);
  }
  if (failed.empty()) return OkStatus();
  bool timeout = false, same = true;
  std::string detail;
  for (const SetupOutcome& o : failed) {
    timeout |= o.code == static_cast<int32_t>(ErrorCode::kCommInitTimeout);
    same &= o.code == failed[0].code;
    detail += fmt::format("{}rank {} after {:.2f} s: {}", detail.empty() ? "" : "; ", o.rank,
                          o.seconds, Text(o.message, sizeof(o.message)));
  }
  // One cause everywhere keeps its own code (and remedy); mixed causes are a timeout if any was.
  const ErrorCode code = same      ? static_cast<ErrorCode>(failed[0].code)
                         : timeout ? ErrorCode::kCommInitTimeout
                                   : ErrorCode::kCommFailed;
  return MakeError(code, "the NCCL communicator set-up failed on {} of {} ranks: {}", failed.size(),
                   group.size(), detail);
}

// The same checks run on every rank over the same table, so every rank fails with one message.
Status CheckConsistency(const std::vector<HelloRecord>& table, int comm_size) {
  std::map<int, std::vector<int>> by_world;  // claimed world size -> claimed ranks
  for (const HelloRecord& h : table) by_world[h.claimed_world].push_back(h.claimed_rank);
  if (by_world.size() > 1 || by_world.begin()->first != comm_size) {
    std::string detail;
    for (const auto& [world, ranks] : by_world) {
      std::string list;
      for (int r : ranks) list += (list.empty() ? "" : ",") + std::to_string(r);
      detail += fmt::format("{}world size {} claimed by rank(s) {}", detail.empty() ? "" : "; ",
                            world, list);
    }
    return MakeError(ErrorCode::kWorldSizeMismatch, "{} processes are running but {}", comm_size,
                     detail);
  }
  std::map<int, std::vector<const HelloRecord*>> by_rank;
  for (const HelloRecord& h : table) by_rank[h.claimed_rank].push_back(&h);
  for (const auto& [rank, claims] : by_rank) {
    if (claims.size() > 1) {
      std::string who;
      for (const HelloRecord* h : claims) {
        who += fmt::format("{}host {} pid {} (transport rank {})", who.empty() ? "" : ", ",
                           Text(h->host, sizeof(h->host)), h->pid, h->transport_rank);
      }
      std::set<int> unclaimed;
      for (int r = 0; r < comm_size; ++r) {
        if (!by_rank.count(r)) unclaimed.insert(r);
      }
      return MakeError(ErrorCode::kDuplicateRank, "rank {} is claimed by {} processes: {}{}", rank,
                       claims.size(), who,
                       unclaimed.empty()
                           ? std::string()
                           : fmt::format("; rank {} is claimed by none", *unclaimed.begin()));
    }
  }
  return OkStatus();
}

// Ranks of one group must agree on the key; otherwise they would share an engine that is wrong
// for some of them.
Status CheckKeys(const std::vector<HelloRecord>& table, const std::vector<int>& colors,
                 bool per_arch) {
  std::map<int, std::map<std::string, std::vector<const HelloRecord*>>> groups;
  for (size_t i = 0; i < table.size(); ++i) {
    groups[colors[i]][Text(table[i].key, sizeof(table[i].key))].push_back(&table[i]);
  }
  for (const auto& [color, keys] : groups) {
    if (keys.size() <= 1) continue;
    std::string detail;
    for (const auto& [key, members] : keys) {
      std::string ranks;
      for (const HelloRecord* h : members)
        ranks += (ranks.empty() ? "" : ",") + std::to_string(h->claimed_rank);
      detail +=
          fmt::format("{}rank(s) {} have key {} (arch '{}')", detail.empty() ? "" : "; ", ranks,
                      key.substr(0, 12), Text(members[0]->arch, sizeof(members[0]->arch)));
    }
    std::set<std::string> archs;
    for (const auto& [key, members] : keys)
      archs.insert(Text(members[0]->arch, sizeof(members[0]->arch)));
    return MakeError(
        ErrorCode::kKeyMismatch, "ranks that would share one engine disagree: {}{}", detail,
        archs.size() > 1 && !per_arch ? " (several architectures: use --build-on per-arch)" : "");
  }
  return OkStatus();
}

std::vector<int> GroupColors(const std::vector<HelloRecord>& table, BuildOn build_on) {
  std::vector<int> colors(table.size(), 0);
  if (build_on == BuildOn::kRank0) return colors;
  std::map<std::string, int> index;
  for (const HelloRecord& h : table) {
    index[build_on == BuildOn::kPerNode ? Text(h.node, sizeof(h.node))
                                        : Text(h.arch, sizeof(h.arch))] = 0;
  }
  int next = 0;
  for (auto& [name, color] : index) color = next++;
  for (size_t i = 0; i < table.size(); ++i) {
    const HelloRecord& h = table[i];
    colors[i] = index[build_on == BuildOn::kPerNode ? Text(h.node, sizeof(h.node))
                                                    : Text(h.arch, sizeof(h.arch))];
  }
  return colors;
}

struct LeaderOutcome {
  StatusOr<std::vector<std::byte>> bytes = MakeError(ErrorCode::kInternal, "not built");
  Role role = kBuilt;
  double wait_s = 0;
  double build_s = 0;
};

LeaderOutcome RunLeader(const CacheKey& key, const BuildOnceOptions& options,
                        const BuildFn& build) {
  LeaderOutcome out;
  if (options.cache) {
    StatusOr<std::unique_ptr<EngineCache>> cache = EngineCache::Open(*options.cache);
    if (!cache.ok()) {
      out.bytes = cache.status();
      return out;
    }
    StatusOr<CacheResult> r = (*cache)->GetOrBuild(key.Hex(), build);
    if (!r.ok()) {
      out.bytes = r.status();
      return out;
    }
    out.role = r->outcome == CacheOutcome::kHit     ? kCacheHit
               : r->outcome == CacheOutcome::kBuilt ? kBuilt
                                                    : kTookOver;
    out.wait_s = r->wait_s;
    out.build_s = r->build_s;
    out.bytes = std::move(r->bytes);
    return out;
  }
  ProgressSink sink;
  const Clock::time_point t0 = Clock::now();
  out.bytes = build(sink);
  out.build_s = SecondsSince(t0);
  if (out.bytes.ok() && options.verify) {
    if (Status v = options.verify(*out.bytes); !v.ok()) {
      out.bytes = std::move(v).AddContext("verifying the engine just built, before sharing it");
    }
  }
  return out;
}

// RunLeader on a thread of its own while this one sends the group a heartbeat (the build's latest
// progress line) every heartbeat_interval; the result header follows as without heartbeats.
LeaderOutcome RunLeaderWithHeartbeats(const CacheKey& key, const BuildOnceOptions& options,
                                      const BuildFn& build, Communicator& group) {
  ProgressSink relay;
  const BuildFn relayed = [&build, &relay](ProgressSink&) { return build(relay); };
  std::promise<LeaderOutcome> done;
  std::future<LeaderOutcome> result = done.get_future();
  std::thread builder([&] { done.set_value(RunLeader(key, options, relayed)); });
  Status beat;
  while (result.wait_for(options.heartbeat_interval) != std::future_status::ready) {
    if (!beat.ok()) continue;  // the group is gone; the build still finishes before returning
    ResultHeader header{};
    header.outcome = kInProgress;
    CopyText(header.message, relay.Latest());
    beat = group.Broadcast(std::as_writable_bytes(std::span(&header, 1)), 0,
                           Clock::now() + options.transfer_timeout, "build heartbeat");
  }
  builder.join();
  LeaderOutcome out = result.get();
  if (!beat.ok() && out.bytes.ok()) {
    out.bytes = std::move(beat).AddContext("sending the build's progress to the group");
  }
  return out;
}

// A non-leader's wait for the leader's result header: one wait bounded by wait_timeout, or, with
// heartbeats, one per heartbeat (each bounded by heartbeat_timeout, all by wait_timeout).
Status WaitForResult(const BuildOnceOptions& options, Communicator& group, const std::string& who,
                     ResultHeader* header) {
  const Deadline wait_deadline = Clock::now() + options.wait_timeout;
  const bool beats = options.heartbeat_interval.count() > 0 && group.size() > 1;
  while (true) {
    const Deadline beat_deadline = Clock::now() + options.heartbeat_timeout;
    const bool bounded_by_beat = beats && beat_deadline < wait_deadline;
    Status s = group.Broadcast(std::as_writable_bytes(std::span(header, 1)), 0,
                               bounded_by_beat ? beat_deadline : wait_deadline, "result header");
    if (!s.ok() && bounded_by_beat && s.code() == ErrorCode::kCollectiveTimeout) {
      return MakeError(ErrorCode::kRankMissing,
                       "the builder {} sent no heartbeat for {:.0f} s (it sends one every "
                       "{:.1f} s while it builds): it hung or left the job",
                       who, std::chrono::duration<double>(options.heartbeat_timeout).count(),
                       std::chrono::duration<double>(options.heartbeat_interval).count());
    }
    if (!s.ok()) {
      return std::move(s).AddContext(
          fmt::format("waiting (bound {:.0f} s) for the builder {} to finish",
                      std::chrono::duration<double>(options.wait_timeout).count(), who));
    }
    if (header->outcome != kInProgress) return OkStatus();
    if (options.on_progress) options.on_progress(Text(header->message, sizeof(header->message)));
  }
}

// A process that has exited: no such pid, or a zombie its parent has not reaped yet (torchrun's
// agent and multiprocessing reap their children only when they next look).
bool ProcessExited(int64_t pid) {
  if (::kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  // "pid (comm) S ...": the state follows the last ')' (comm may hold anything).
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return false;
  const char state = line[paren + 2];
  return state == 'Z' || state == 'X';
}

// A dying process closes its sockets a moment before it becomes a zombie: a peer that saw the
// connection close looks again for up to `grace` before it calls the process alive.
constexpr Millis kExitGrace{1000};
bool ProcessGone(int64_t pid, Millis grace) {
  const Deadline until = Clock::now() + grace;
  while (!ProcessExited(pid)) {
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

std::string_view CacheField(const BuildOnceOptions& options, Role leader_role) {
  if (!options.cache) return "none";
  switch (leader_role) {
    case kCacheHit:
      return "hit";
    case kTookOver:
      return "took-over";
    default:
      return "built";
  }
}

// ---- BuildOnce's phases: elect, build (the leader) or receive (the others), relay, report ----

// The transport the options and the launch call for (kAuto resolved).
StatusOr<Transport> ResolveTransport(const BuildOnceOptions& options, const RankInfo& me) {
  if (options.transport != Transport::kAuto) return options.transport;
  if (options.comm || (me.world_size > 1 && MpiAvailable())) return Transport::kMpi;
  // torchrun or Slurm without MPI: meet in the cache.
  if (me.world_size > 1 && options.cache) return Transport::kCache;
  if (me.world_size > 1) {
    return MakeError(
        ErrorCode::kTransportUnavailable,
        "world size {} (from {}) but MPI is not running: launch with mpirun or srun "
        "--mpi, use --transport nccl (torchrun: control over TCP to MASTER_ADDR), or give a "
        "shared cache directory (--cache-dir) for --transport cache",
        me.world_size, me.launcher);
  }
  return Transport::kLocal;
}

// No communication: this process goes through the cache directory by itself (or builds alone).
StatusOr<BuildOnceResult> BuildAlone(const CacheKey& key, const BuildOnceOptions& options,
                                     const BuildFn& build, Transport transport, const RankInfo& me,
                                     BuildOnceResult result) {
  if (transport == Transport::kLocal && me.world_size > 1) {
    return MakeError(ErrorCode::kTransportUnavailable,
                     "--transport local with world size {} (from {}): use mpi, nccl or cache",
                     me.world_size, me.launcher);
  }
  if (transport == Transport::kCache && !options.cache) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "--transport cache needs a cache directory (--cache-dir)");
  }
  LeaderOutcome out = RunLeader(key, options, build);
  KILN_RETURN_IF_ERROR(out.bytes);
  BuildOnceReport& report = result.report;
  result.bytes = std::move(out.bytes).value();
  report.builders = {me.rank};
  report.cache = CacheField(options, out.role);
  report.build_s = out.build_s;
  report.bytes = result.bytes.size();
  report.checksum = HashBytes(result.bytes).Hex();
  report.ranks.push_back({me.rank, me.host, kRoleNames[out.role], out.wait_s, 0, out.build_s, 0});
  return result;
}

// The communicator of the whole job: the caller's, or MPI's world, or (torchrun with --transport
// nccl and no MPI) TCP through rank 0.
StatusOr<std::unique_ptr<Communicator>> OpenWorld(const BuildOnceOptions& options,
                                                  Transport transport, const RankInfo& me) {
  if (transport == Transport::kNccl && !MpiAvailable() &&
      (me.world_size == 1 || !me.master_addr.empty())) {
    // Control messages, and so the NCCL unique id, go over TCP through rank 0 at
    // MASTER_ADDR:MASTER_PORT + kTcpExchangePortOffset.
    return TcpConnect(me, Clock::now() + options.join_timeout);
  }
  return MpiWorld();
}

// Who is in which group and who builds for it, as every rank of the job agreed.
struct Election {
  std::vector<HelloRecord> table;  // by transport rank
  std::unique_ptr<Communicator> owned_group;
  Communicator* group = nullptr;  // this rank's group (the world when there is one group)
  bool leader = false;            // this rank builds for its group
  HelloRecord leader_hello{};     // who does
};

// Elect: everyone says who they are (rank 0 names whoever does not arrive), every rank checks the
// same table alike, the ranks form groups by build_on, and the lowest transport rank of each
// group is its leader.
StatusOr<Election> Elect(Communicator& world, const RankInfo& me, const CacheKey& key,
                         const BuildOnceOptions& options, BuildOnceReport& report) {
  const Clock::time_point t_hello = Clock::now();
  HelloRecord hello{};
  hello.claimed_rank = me.rank;
  hello.claimed_world = me.world_size;
  hello.local_rank = me.local_rank;
  hello.transport_rank = world.rank();
  hello.pid = getpid();
  CopyText(hello.host, me.host);
  CopyText(hello.node, me.node);
  CopyText(hello.arch, key.arch);
  CopyText(hello.key, report.key);
  KILN_ASSIGN_OR_RETURN(std::vector<std::byte> table_bytes,
                        world.AllGather(AsBytes(hello), Clock::now() + options.join_timeout,
                                        "build-once rank exchange"));
  Election e;
  e.table = Unpack<HelloRecord>(table_bytes);
  KILN_RETURN_IF_ERROR(CheckConsistency(e.table, world.size()));
  const std::vector<int> colors = GroupColors(e.table, options.build_on);
  KILN_RETURN_IF_ERROR(CheckKeys(e.table, colors, options.build_on == BuildOn::kPerArch));
  report.handshake_s = SecondsSince(t_hello);
  report.world_size = world.size();

  std::map<int, int> leader_of;  // color -> transport rank of its leader
  for (size_t i = 0; i < e.table.size(); ++i) {
    if (!leader_of.count(colors[i])) leader_of[colors[i]] = static_cast<int>(i);
  }
  for (const auto& [color, leader] : leader_of)
    report.builders.push_back(e.table[leader].claimed_rank);
  e.group = &world;
  if (leader_of.size() > 1) {
    KILN_ASSIGN_OR_RETURN(e.owned_group, world.Split(colors[world.rank()], world.rank()));
    e.group = e.owned_group.get();
  }
  e.leader = e.group->rank() == 0;
  e.leader_hello = e.table[leader_of[colors[world.rank()]]];
  return e;
}

// Build (the leader): build or read the cache, with heartbeats to the group when asked, then send
// the group the header that carries the verdict (size and checksum, or the error).
Status Build(const CacheKey& key, const BuildOnceOptions& options, const BuildFn& build,
             Communicator& group, BuildOnceResult& result, ResultHeader& header,
             StatsRecord& stats) {
  LeaderOutcome out = options.heartbeat_interval.count() > 0 && group.size() > 1
                          ? RunLeaderWithHeartbeats(key, options, build, group)
                          : RunLeader(key, options, build);
  stats.role = out.role;
  stats.wait_s = out.wait_s;
  stats.build_s = out.build_s;
  header.outcome = out.role;
  header.build_s = out.build_s;
  if (out.bytes.ok()) {
    result.bytes = std::move(out.bytes).value();
    const Hash128 h = HashBytes(result.bytes);
    header.size = result.bytes.size();
    header.hash_high = h.high;
    header.hash_low = h.low;
  } else {
    header.code = static_cast<int32_t>(out.bytes.status().code());
    CopyText(header.message, out.bytes.status().ToString());
  }
  KILN_RETURN_IF_ERROR_CTX(
      group.Broadcast(std::as_writable_bytes(std::span(&header, 1)), 0,
                      Clock::now() + options.transfer_timeout, "result header"),
      "sending the build result to the group");
  return out.bytes.status();
}

// Receive (the others): wait, bounded, for the leader's verdict; a leader that failed fails this
// rank with its error, one that died or hangs is named as such.
Status Receive(const BuildOnceOptions& options, const Election& e, const RankInfo& me,
               BuildOnceResult& result, ResultHeader& header, StatsRecord& stats) {
  const Clock::time_point t_wait = Clock::now();
  const HelloRecord& builder = e.leader_hello;
  if (Status s = WaitForResult(options, *e.group, Who(builder), &header); !s.ok()) {
    Status explained = ExplainBuilderWait(s, Who(builder), Text(builder.host, sizeof(builder.host)),
                                          builder.pid, me.host);
    // A missed heartbeat from a builder still alive stays what it is (hung or left the job).
    if (s.code() == ErrorCode::kRankMissing && explained.code() != ErrorCode::kBuilderLost) {
      return s;
    }
    return explained;
  }
  stats.wait_s = SecondsSince(t_wait);
  if (header.code != 0) {
    return MakeError(ErrorCode::kBuildFailedOnBuilder, "the builder {} failed: {}", Who(builder),
                     Text(header.message, sizeof(header.message)));
  }
  result.bytes.resize(header.size);
  return OkStatus();
}

// Relay: the bytes from the leader to its group (NCCL when asked, else the control communicator);
// the others check them against the leader's checksum and verify them.
Status Relay(const BuildOnceOptions& options, Transport transport, const Election& e,
             const RankInfo& me, const ResultHeader& header, BuildOnceResult& result,
             StatsRecord& stats) {
  Communicator& group = *e.group;
  std::unique_ptr<BulkTransport> bulk;
  if (transport == Transport::kNccl) {
    // The set-up gets --join-timeout less a reserve in which every rank learns how the others'
    // set-up went, so that a rank stuck in it (or gone) is named on every rank that is not.
    const Clock::time_point t_setup = Clock::now();
    const Deadline join_deadline = t_setup + options.join_timeout;
    const Millis reserve = std::min<Millis>(std::chrono::seconds(5), options.join_timeout / 5);
    StatusOr<std::unique_ptr<BulkTransport>> made =
        options.bulk_factory(group, me, join_deadline - reserve);
    KILN_RETURN_IF_ERROR(ShareSetupOutcome(group, made.status(), SecondsSince(t_setup),
                                           std::max(join_deadline, Clock::now() + reserve)));
    bulk = std::move(*made);
    result.report.bulk_setup_s = bulk->setup_seconds();
    stats.bulk_setup_s = result.report.bulk_setup_s;
  }
  const Clock::time_point t_xfer = Clock::now();
  const Deadline xfer_deadline = Clock::now() + options.transfer_timeout;
  Status sent = bulk ? bulk->Broadcast(result.bytes, 0, xfer_deadline)
                     : group.Broadcast(result.bytes, 0, xfer_deadline, "engine bytes");
  if (!sent.ok() && !e.leader) {
    // The builder died (or hangs) mid-transfer: say so (KILN-E7020), not the broken connection.
    sent = ExplainBuilderWait(std::move(sent), Who(e.leader_hello),
                              Text(e.leader_hello.host, sizeof(e.leader_hello.host)),
                              e.leader_hello.pid, me.host);
  }
  KILN_RETURN_IF_ERROR_CTX(sent, "sharing {} engine bytes from {}", header.size,
                           Who(e.leader_hello));
  stats.transfer_s = SecondsSince(t_xfer);
  if (e.leader) return OkStatus();
  const Hash128 got = HashBytes(result.bytes);
  if (got != Hash128{header.hash_high, header.hash_low}) {
    return MakeError(ErrorCode::kTransferCorrupt,
                     "received {} bytes from {} hash to {}, the builder's to {}",
                     result.bytes.size(), Who(e.leader_hello), got.Hex(),
                     Hash128{header.hash_high, header.hash_low}.Hex());
  }
  if (options.verify)
    KILN_RETURN_IF_ERROR_CTX(options.verify(result.bytes), "verifying the received engine");
  return OkStatus();
}

// Report: who did what (every rank gets the whole table).
Status ShareReport(Communicator& world, const BuildOnceOptions& options, const Election& e,
                   const StatsRecord& stats, const ResultHeader& header, BuildOnceResult& result) {
  KILN_ASSIGN_OR_RETURN(std::vector<std::byte> stats_bytes,
                        world.AllGather(AsBytes(stats), Clock::now() + options.join_timeout,
                                        "build-once report exchange"));
  BuildOnceReport& report = result.report;
  const std::vector<StatsRecord> all = Unpack<StatsRecord>(stats_bytes);
  for (size_t i = 0; i < all.size(); ++i) {
    report.ranks.push_back({all[i].rank, Text(e.table[i].host, sizeof(e.table[i].host)),
                            kRoleNames[all[i].role], all[i].wait_s, all[i].transfer_s,
                            all[i].build_s, all[i].bulk_setup_s});
  }
  std::sort(report.ranks.begin(), report.ranks.end(),
            [](const RankReport& a, const RankReport& b) { return a.rank < b.rank; });
  report.cache = CacheField(options, static_cast<Role>(header.outcome));
  report.build_s = header.build_s;
  report.bytes = result.bytes.size();
  report.checksum = Hash128{header.hash_high, header.hash_low}.Hex();
  return OkStatus();
}

}  // namespace

StatusOr<Transport> ParseTransport(std::string_view t) {
  if (t == "auto") return Transport::kAuto;
  if (t == "local") return Transport::kLocal;
  if (t == "mpi") return Transport::kMpi;
  if (t == "nccl") return Transport::kNccl;
  if (t == "cache") return Transport::kCache;
  return MakeError(ErrorCode::kInvalidArgument,
                   "--transport '{}': use auto, local, mpi, nccl or cache", t);
}

StatusOr<BuildOn> ParseBuildOn(std::string_view t) {
  if (t == "rank0") return BuildOn::kRank0;
  if (t == "per-node") return BuildOn::kPerNode;
  if (t == "per-arch") return BuildOn::kPerArch;
  return MakeError(ErrorCode::kInvalidArgument, "--build-on '{}': use rank0, per-node or per-arch",
                   t);
}

std::string_view ToString(Transport t) {
  constexpr std::string_view names[] = {"auto", "local", "mpi", "nccl", "cache"};
  return names[static_cast<int>(t)];
}

std::string_view ToString(BuildOn b) {
  constexpr std::string_view names[] = {"rank0", "per-node", "per-arch"};
  return names[static_cast<int>(b)];
}

std::string BuildOnceReport::ToJson() const {
  nlohmann::json ranks_json = nlohmann::json::array();
  for (const RankReport& r : ranks) {
    ranks_json.push_back({{"rank", r.rank},
                          {"host", r.host},
                          {"role", r.role},
                          {"wait_s", r.wait_s},
                          {"transfer_s", r.transfer_s},
                          {"build_s", r.build_s},
                          {"bulk_setup_s", r.bulk_setup_s}});
  }
  nlohmann::json j = {{"key", key},
                      {"transport", transport},
                      {"build_on", build_on},
                      {"world_size", world_size},
                      {"rank", rank},
                      {"builders", builders},
                      {"cache", cache},
                      {"handshake_s", handshake_s},
                      {"bulk_setup_s", bulk_setup_s},
                      {"build_s", build_s},
                      {"total_s", total_s},
                      {"bytes", bytes},
                      {"checksum", checksum},
                      {"ranks", ranks_json}};
  return j.dump(2);
}


Status ExplainBuilderWait(Status wait_error, std::string_view builder,
                          std::string_view builder_host, int64_t builder_pid,
                          std::string_view my_host) {
  const ErrorCode code = wait_error.code();
  // A communicator that failed (rather than timed out) says a peer broke the connection.
  const bool failed = code == ErrorCode::kCommFailed || code == ErrorCode::kProcessGroupFailed;
  if (code != ErrorCode::kCommInitTimeout && code != ErrorCode::kCollectiveTimeout &&
      code != ErrorCode::kRankMissing && !failed) {
    return wait_error;
  }
  if (builder_host == my_host && builder_pid > 0) {
    if (ProcessGone(builder_pid, failed ? kExitGrace : Millis(0))) {
      return MakeError(ErrorCode::kBuilderLost,
                       "the builder {} died before it sent the engine: its process is gone ({})",
                       builder, wait_error.message());
    }
    if (failed) return wait_error;
    return MakeError(ErrorCode::kCacheWaitTimeout,
                     "the builder {} is still running but sent no result within the bound ({})",
                     builder, wait_error.message());
  }
  return MakeError(ErrorCode::kBuilderLost,
                   "the builder {} stopped answering before it sent the engine: it died or hangs "
                   "(its process on host {} cannot be checked from host {}) ({})",
                   builder, builder_host, my_host, wait_error.message());
}

StatusOr<BuildOnceResult> BuildOnce(const CacheKey& key, const BuildOnceOptions& options,
                                    const BuildFn& build) {
  const Clock::time_point start = Clock::now();
  // Every wait below is bounded by one of these; a bound that is not positive is a caller's
  // mistake (the CLI refuses it), never "wait forever" nor "time out at once".
  for (auto [bound, name] :
       {std::pair{options.join_timeout, "join"}, std::pair{options.wait_timeout, "wait"},
        std::pair{options.transfer_timeout, "transfer"}}) {
    if (bound.count() <= 0) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "the build-once {} timeout must be positive "
                       "(got {} ms)",
                       name, bound.count());
    }
  }
  KILN_ASSIGN_OR_RETURN(RankInfo me, DiscoverRank(options.rank_overrides));
  KILN_ASSIGN_OR_RETURN(Transport transport, ResolveTransport(options, me));
  BuildOnceResult result;
  BuildOnceReport& report = result.report;
  report.key = key.Hex();
  report.transport = ToString(transport);
  report.build_on = ToString(options.build_on);
  report.world_size = me.world_size;
  report.rank = me.rank;

  if (transport == Transport::kCache || (transport == Transport::kLocal && !options.comm)) {
    KILN_ASSIGN_OR_RETURN(result,
                          BuildAlone(key, options, build, transport, me, std::move(result)));
    result.report.total_s = SecondsSince(start);
    return result;
  }
  std::unique_ptr<Communicator> owned_world;
  Communicator* world = options.comm;
  if (world == nullptr) {
    KILN_ASSIGN_OR_RETURN(owned_world, OpenWorld(options, transport, me));
    world = owned_world.get();
  }
  if (transport != Transport::kNccl) report.transport = world->kind();
  if (transport == Transport::kNccl && !options.bulk_factory) {
    return MakeError(
        ErrorCode::kTransportUnavailable,
        "--transport nccl, but this kiln was built without NCCL (no CUDA toolkit at build time)");
  }

  KILN_ASSIGN_OR_RETURN(Election election, Elect(*world, me, key, options, report));
  StatsRecord stats{me.rank, kReceived, 0, 0, 0, 0};
  ResultHeader header{};
  if (election.leader) {
    KILN_RETURN_IF_ERROR(Build(key, options, build, *election.group, result, header, stats));
  } else {
    KILN_RETURN_IF_ERROR(Receive(options, election, me, result, header, stats));
  }
  KILN_RETURN_IF_ERROR(Relay(options, transport, election, me, header, result, stats));
  KILN_RETURN_IF_ERROR(ShareReport(*world, options, election, stats, header, result));
  report.total_s = SecondsSince(start);
  return result;
}

}  // namespace kiln::distributed
