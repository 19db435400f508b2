#pragma once
// What the benchmark programs share: running a peer script and reading its one-line JSON
// result, a few JSON scraps, shell quoting, CPU time.

#include <time.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

namespace coload::bench {

/// The value of `"key":` in the flat one-line JSON object `line`, unparsed (string values
/// unquoted). The objects are our own scripts', so a scan is enough.
inline std::optional<std::string> json_field(const std::string& line, const std::string& key) {
  const std::string k = "\"" + key + "\"";
  auto p = line.find(k);
  if (p == std::string::npos) return std::nullopt;
  p = line.find(':', p + k.size());
  if (p == std::string::npos) return std::nullopt;
  ++p;
  while (p < line.size() && line[p] == ' ') ++p;
  if (p < line.size() && line[p] == '"') {
    const auto q = line.find('"', p + 1);
    if (q == std::string::npos) return std::nullopt;
    return line.substr(p + 1, q - p - 1);
  }
  const auto q = line.find_first_of(",}", p);
  return line.substr(p, q == std::string::npos ? std::string::npos : q - p);
}

/// The number at `"key":` in `line`; nothing when absent, null or not a finite number.
inline std::optional<double> json_double(const std::string& line, const std::string& key) {
  const auto s = json_field(line, key);
  if (!s || *s == "null") return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(s->c_str(), &end);
  if (end == s->c_str() || !std::isfinite(v)) return std::nullopt;
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
