// Status implementation and the error catalog table built from errors.inc.
#include "kiln/core/status.h"

#include <array>
#include <charconv>

namespace kiln {

namespace {
constexpr ErrorInfo kCatalog[] = {
#define KILN_ERROR(name, number, subsystem, summary, remedy) \
  {ErrorCode::k##name, number, #name, subsystem, summary, remedy},
#include "kiln/core/errors.inc"
#undef KILN_ERROR
};

constexpr ErrorInfo kOkInfo{ErrorCode::kOk, 0, "Ok", "core", "success", ""};
const std::vector<std::string> kNoContext;
const std::string kEmpty;
}  // namespace

std::span<const ErrorInfo> ErrorCatalog() { return kCatalog; }

const ErrorInfo& LookupError(ErrorCode code) {
  for (const ErrorInfo& e : kCatalog) {
    if (e.code == code) return e;
  }
  return kOkInfo;
}

const ErrorInfo* FindError(std::string_view id) {
  if (id.starts_with("KILN-")) id.remove_prefix(5);
  if (id.starts_with("E") || id.starts_with("e")) id.remove_prefix(1);
  int number = 0;
  auto [ptr, ec] = std::from_chars(id.data(), id.data() + id.size(), number);
  if (ec != std::errc() || ptr != id.data() + id.size()) return nullptr;
  for (const ErrorInfo& e : kCatalog) {
    if (e.number == number) return &e;
  }
  return nullptr;
}

Status::Status(ErrorCode code, std::string message)
    : state_(code == ErrorCode::kOk
                 ? nullptr
                 : std::make_unique<State>(State{code, std::move(message), {}})) {}

Status::Status(const Status& other)
    : state_(other.state_ ? std::make_unique<State>(*other.state_) : nullptr) {}

Status& Status::operator=(const Status& other) {
  if (this != &other) state_ = other.state_ ? std::make_unique<State>(*other.state_) : nullptr;
  return *this;
}

Status::Status(Status&&) noexcept = default;
Status& Status::operator=(Status&&) noexcept = default;
Status::~Status() = default;

ErrorCode Status::code() const { return state_ ? state_->code : ErrorCode::kOk; }

std::string Status::Id() const { return state_ ? LookupError(state_->code).Id() : std::string(); }

const std::string& Status::message() const { return state_ ? state_->message : kEmpty; }

const std::vector<std::string>& Status::context() const {
  return state_ ? state_->context : kNoContext;
}

std::string_view Status::remedy() const { return LookupError(code()).remedy; }

Status& Status::AddContext(std::string line) & {
  if (state_) state_->context.push_back(std::move(line));
  return *this;
}

Status&& Status::AddContext(std::string line) && {
  if (state_) state_->context.push_back(std::move(line));
  return std::move(*this);
}

std::string Status::ToString() const {
  if (!state_) return "OK";
  const ErrorInfo& info = LookupError(state_->code);
  std::string out = fmt::format("{} [{}] {}", info.Id(), info.subsystem, state_->message);
  if (!state_->context.empty()) {
    out += " (";
    for (size_t i = 0; i < state_->context.size(); ++i) {
      if (i) out += "; ";
      out += state_->context[i];
    }
    out += ")";
  }
  return out;
}

std::string Status::Explain() const {
  if (!state_) return "OK";
  const ErrorInfo& info = LookupError(state_->code);
  std::string out = fmt::format("error {} [{}]: {}\n  what: {}\n", info.Id(), info.subsystem,
                                info.summary, state_->message);
  for (const std::string& c : state_->context) out += fmt::format("  while: {}\n", c);
  out += fmt::format("  remedy: {}\n", info.remedy);
  return out;
}

}  // namespace kiln
