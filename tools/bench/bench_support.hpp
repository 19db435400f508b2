#pragma once
// What the benchmark programs share: running a peer script and reading its one-line JSON
// result (parsed by nlohmann-json), a few JSON scraps, shell quoting, CPU time.

#include <time.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "coload/loader/auto_workers.hpp"

namespace coload::bench {

/// A `--workers` value: a count >= 0, or "auto" for coload::auto_workers; nothing for anything
/// else.
inline std::optional<int> parse_workers(const std::string& s) {
  if (s == "auto") return coload::auto_workers;
  if (s.empty() || s.size() > 4 || s.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return std::atoi(s.c_str());
}
/// The `--workers` check for CLI11's check(): empty when parse_workers reads `s`, else what is
/// wrong with it.
inline std::string workers_error(const std::string& s) {
  return parse_workers(s) ? std::string() : "expected a count >= 0 or auto, got " + s;
}
/// "auto" or the count, as parse_workers reads it.
inline std::string workers_name(int workers) {
  return workers == coload::auto_workers ? std::string("auto") : std::to_string(workers);
}

/// The value of `"key"` in the one-line JSON object `line` as text: a string's contents, or
/// any other value as JSON writes it (`null` included); nothing when `line` is not a JSON
/// object or has no such key.
inline std::optional<std::string> json_field(const std::string& line, const std::string& key) {
  const auto object = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!object.is_object()) return std::nullopt;
  const auto it = object.find(key);
  if (it == object.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  return it->dump();
}

/// The number at `"key"` in `line`; nothing when absent, null or not a finite number.
inline std::optional<double> json_double(const std::string& line, const std::string& key) {
  const auto object = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!object.is_object()) return std::nullopt;
  const auto it = object.find(key);
  if (it == object.end() || !it->is_number()) return std::nullopt;
  const double v = it->get<double>();
  if (!std::isfinite(v)) return std::nullopt;
  return v;
}

/// `v` as a JSON number, or null.
inline std::string json_number(std::optional<double> v) {
  if (!v || !std::isfinite(*v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.10g", *v);
  return buf;
}

/// `s` quoted for /bin/sh (paths may hold spaces or quotes).
inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

/// What a peer command printed: its exit status and its last non-empty line (where the
/// scripts print their JSON result).
struct PeerOutput {
  bool started = false;
  int status = -1;
  std::string last_line;
  std::string error;  // why it could not start
};

/// Runs `command` through /bin/sh and collects its standard output.
inline PeerOutput run_peer(const std::string& command) {
  PeerOutput r;
  std::FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) {
    r.error = std::string("popen failed: ") + std::strerror(errno);
    return r;
  }
  r.started = true;
  std::string out;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  r.status = ::pclose(pipe);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  const auto nl = out.rfind('\n');
  r.last_line = nl == std::string::npos ? out : out.substr(nl + 1);
  return r;
}

/// CPU seconds this process has used, all threads together.
inline double cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace coload::bench
