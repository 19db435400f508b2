// The cgroup CPU quota's CPUs. Written here rather than taken from a library: no Debian or PyPI
// package reads cgroup limits for C++ (Go's runtime and the JVM carry their own readers).
// Format references: the kernel's Documentation/admin-guide/cgroup-v2.rst (cpu.max),
// sched-bwc.rst (cfs_quota_us), and proc(5) for /proc/self/cgroup and /proc/self/mountinfo.

#include "cpu_quota.hpp"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

namespace coload::detail {
namespace {

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  while (true) {
    const auto at = s.find(sep);
    out.push_back(s.substr(0, at));
    if (at == std::string_view::npos) return out;
    s.remove_prefix(at + 1);
  }
}

// mountinfo escapes a space, tab, newline and backslash in a path as \ and three octal digits.
std::string unescape(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && s.size() - i >= 4) {
      const auto octal = [](char c) { return c >= '0' && c <= '7'; };
      if (octal(s[i + 1]) && octal(s[i + 2]) && octal(s[i + 3])) {
        out.push_back(static_cast<char>(((s[i + 1] - '0') << 6) | ((s[i + 2] - '0') << 3) |
                                        (s[i + 3] - '0')));
        i += 3;
        continue;
      }
    }
    out.push_back(s[i]);
  }
  return out;
}

std::optional<std::int64_t> to_int(std::string_view s) {
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// The first line of a small file, without its newline; nothing where it cannot be read.
std::optional<std::string> first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return line;
}

// ceil(quota / period) as CPUs, at least 1; nothing for no quota or a malformed one.
std::optional<int> cpus(std::optional<std::int64_t> quota, std::optional<std::int64_t> period) {
  if (!quota || !period || *quota <= 0 || *period <= 0) return std::nullopt;
  const std::int64_t n = *quota / *period + (*quota % *period != 0 ? 1 : 0);
  return static_cast<int>(std::clamp<std::int64_t>(n, 1, INT_MAX));
}

// cgroup v2: "max 100000" (no quota) or "QUOTA PERIOD".
std::optional<int> v2_limit(const std::string& dir) {
  const auto line = first_line(dir + "/cpu.max");
  if (!line) return std::nullopt;
  const auto fields = split(*line, ' ');
  if (fields.size() != 2 || fields[0] == "max") return std::nullopt;
  return cpus(to_int(fields[0]), to_int(fields[1]));
}

// cgroup v1: cpu.cfs_quota_us is -1 for no quota.
std::optional<int> v1_limit(const std::string& dir) {
  const auto quota = first_line(dir + "/cpu.cfs_quota_us");
  const auto period = first_line(dir + "/cpu.cfs_period_us");
  if (!quota || !period) return std::nullopt;
  return cpus(to_int(*quota), to_int(*period));
}

struct Hierarchy {
  bool v2 = false;
  std::string path;  // the process's cgroup in it, from /proc/self/cgroup
};

struct Mount {
  std::string root;   // the cgroup the mount shows at its mount point
  std::string point;  // where it is mounted
};

// Whether `path` is `root` or below it.
bool below_root(const std::string& path, const std::string& root) {
  return root == "/" || path == root ||
         (path.starts_with(root) && path.size() > root.size() && path[root.size()] == '/');
}

// The mount of the v2 hierarchy, or of the v1 one that holds the cpu controller: of several
// (bind mounts, nested containers), the first whose root holds `path`, else the first.
std::optional<Mount> find_mount(std::string_view mountinfo, bool v2, const std::string& path) {
  std::optional<Mount> first;
  for (const auto line : split(mountinfo, '\n')) {
    const auto fields = split(line, ' ');
    const auto dash = std::find(fields.begin(), fields.end(), std::string_view("-"));
    // id, parent, device, root, mount point, options, optional fields, "-", type, source,
    // super options.
    if (dash - fields.begin() < 6 || fields.end() - dash < 4) continue;
    const std::string_view type = dash[1];
    if (v2 ? type != "cgroup2" : type != "cgroup") continue;
    if (!v2) {
      const auto options = split(dash[3], ',');
      if (std::find(options.begin(), options.end(), std::string_view("cpu")) == options.end()) {
        continue;
      }
    }
    Mount m{.root = unescape(fields[3]), .point = unescape(fields[4])};
    if (below_root(path, m.root)) return m;
    if (!first) first = std::move(m);
  }
  return first;
}

}  // namespace

int cgroup_cpu_limit(std::string_view proc_cgroup, std::string_view mountinfo) {
  std::vector<Hierarchy> hierarchies;
  for (const auto line : split(proc_cgroup, '\n')) {
    // "ID:CONTROLLERS:PATH"; the path may itself hold colons.
    const auto first = line.find(':');
    if (first == std::string_view::npos) continue;
    const auto second = line.find(':', first + 1);
    if (second == std::string_view::npos) continue;
    const std::string_view id = line.substr(0, first);
    const std::string_view controllers = line.substr(first + 1, second - first - 1);
    const std::string path(line.substr(second + 1));
    if (id == "0" && controllers.empty()) {
      hierarchies.push_back({.v2 = true, .path = path});
    } else {
      const auto names = split(controllers, ',');
      if (std::find(names.begin(), names.end(), std::string_view("cpu")) != names.end()) {
        hierarchies.push_back({.v2 = false, .path = path});
      }
    }
  }
  int limit = 0;
  for (const Hierarchy& h : hierarchies) {
    const auto mount = find_mount(mountinfo, h.v2, h.path);
    if (!mount) continue;
    // The process's cgroup below the mount's root; one outside it (a container that sees the
    // host's path, a path that climbs with "..", one not absolute) is read at the mount point
    // only.
    std::string below;
    const bool plain = h.path.starts_with('/') && h.path.find("/..") == std::string::npos;
    if (plain && below_root(h.path, mount->root)) {
      below = mount->root == "/" ? h.path : h.path.substr(mount->root.size());
    }
    while (!below.empty() && below.back() == '/') below.pop_back();
    // From the process's cgroup up to the mount point.
    while (true) {
      const std::string dir = mount->point + below;
      if (const auto n = h.v2 ? v2_limit(dir) : v1_limit(dir)) {
        limit = limit == 0 ? *n : std::min(limit, *n);
      }
      if (below.empty()) break;
      below.resize(below.rfind('/'));
    }
  }
  return limit;
}

int cgroup_cpu_limit() {
  const auto slurp = [](const char* path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  try {
    return cgroup_cpu_limit(slurp("/proc/self/cgroup"), slurp("/proc/self/mountinfo"));
  } catch (...) {
    return 0;  // out of memory reading them: no quota known
  }
}

}  // namespace coload::detail
