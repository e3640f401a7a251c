// A streaming writer of indented JSON for reports written on hot paths (the build report that
// every build stores in its engine): appends to one string, no document tree. Output has the
// layout of nlohmann::json::dump(2) ("key": value, two spaces per level) so readers see the same
// files. Strings are escaped per RFC 8259; bytes >= 0x80 pass through (names come from models).
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln {

class JsonWriter {
 public:
  JsonWriter& BeginObject() { return Open('{'); }
  JsonWriter& EndObject() { return Close('}'); }
  JsonWriter& BeginArray() { return Open('['); }
  JsonWriter& EndArray() { return Close(']'); }

  // Inside an object: the key of the next value.
  JsonWriter& Key(std::string_view key) {
    Separate();
    Quote(key);
    out_ += ": ";
    after_key_ = true;
    return *this;
  }
  JsonWriter& String(std::string_view s) {
    Separate();
    Quote(s);
    return *this;
  }
  JsonWriter& Int(int64_t v) {
    Separate();
    fmt::format_to(std::back_inserter(out_), "{}", v);
    return *this;
  }
  // Shortest representation that reads back to the same double; non-finite values are null
  // (as nlohmann writes them).
  JsonWriter& Double(double v) {
    Separate();
    if (!std::isfinite(v)) {
      out_ += "null";
    } else if (v == std::floor(v) && std::fabs(v) < 1e15) {
      fmt::format_to(std::back_inserter(out_), "{:.1f}", v);  // 2.0, not 2: stays a float
    } else {
      fmt::format_to(std::back_inserter(out_), "{}", v);
    }
    return *this;
  }
  JsonWriter& Bool(bool v) {
    Separate();
    out_ += v ? "true" : "false";
    return *this;
  }
  JsonWriter& StringArray(const std::vector<std::string>& items) {
    BeginArray();
    for (const std::string& s : items) String(s);
    return EndArray();
  }

  const std::string& str() const { return out_; }
  std::string Take() { return std::move(out_); }

 private:
  JsonWriter& Open(char c) {
    Separate();
    out_ += c;
    counts_.push_back(0);
    return *this;
  }
  JsonWriter& Close(char c) {
    bool empty = counts_.back() == 0;
    counts_.pop_back();
    if (!empty) Newline();
    out_ += c;
    return *this;
  }
  // Before a value or a key: the comma and line break, unless the value follows its key.
  void Separate() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (counts_.empty()) return;
    if (counts_.back()++ > 0) out_ += ',';
    Newline();
  }
  void Newline() {
    out_ += '\n';
    out_.append(2 * counts_.size(), ' ');
  }
  void Quote(std::string_view s) {
    out_ += '"';
    for (char ch : s) {
      auto c = static_cast<unsigned char>(ch);
      switch (c) {
        case '"':
          out_ += "\\\"";
          break;
        case '\\':
          out_ += "\\\\";
          break;
        case '\n':
          out_ += "\\n";
          break;
        case '\r':
          out_ += "\\r";
          break;
        case '\t':
          out_ += "\\t";
          break;
        case '\b':
          out_ += "\\b";
          break;
        case '\f':
          out_ += "\\f";
          break;
        default:
          if (c < 0x20) {
            fmt::format_to(std::back_inserter(out_), "\\u{:04x}", c);
          } else {
            out_ += ch;
          }
      }
    }
    out_ += '"';
  }

  std::string out_;
  std::vector<int> counts_;  // per open container: values written so far
  bool after_key_ = false;
};

}  // namespace kiln
