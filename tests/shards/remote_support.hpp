#pragma once
// What the tests of shards by URL share (remote_test.cpp, remote_async_test.cpp, one
// executable): the served folder and serve.py's ports (set by main), the samples written,
// the URL of a fault mode, and an epoch's samples as text.

#include <ATen/ATen.h>

#include <stdlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "coload/core/warning.hpp"
#include "coload/core/worker_info.hpp"
#include "coload/shards/stream.hpp"
#include "coload/shards/writer.hpp"
#include "../support/warnings.hpp"
#include "serve.hpp"
#include "shards_test_support.hpp"

namespace remote_test {

using namespace coload;
namespace fs = std::filesystem;
using shards_test::bytes_of;

inline shards_test::Server* server = nullptr;
inline fs::path* root = nullptr;  // the served folder: "shards/" holds the shards
constexpr std::int64_t total = 120;

using coload::test::Warnings;  // tests/support/warnings.hpp

// Sample i's bytes; another `version` changes every byte but no length.
inline std::string payload(std::int64_t i, int version = 0) {
  std::string s(static_cast<std::size_t>(100 + (i * 677) % 9000), '\0');
  for (std::size_t k = 0; k < s.size(); ++k) {
    s[k] = static_cast<char>((i * 31 + k * 7 + static_cast<std::size_t>(version) * 101) & 0xff);
  }
  return s;
}

// The samples 0..total-1 as shards in `dir` (60 kB each, unless `options` say otherwise).
inline void write_shards(const fs::path& dir, int version = 0,
                         shards::WriterOptions options = {.shard_size = 60000}) {
  shards::Writer writer(dir, std::move(options));
  for (std::int64_t i = 0; i < total; ++i) {
    char key[16];
    std::snprintf(key, sizeof key, "s%05lld", static_cast<long long>(i));
    const std::string id = std::to_string(i), bin = payload(i, version);
    const shards::WriteField fields[] = {{"id", bytes_of(id)}, {"bin", bytes_of(bin)}};
    writer.write(key, fields);
  }
  writer.finish();
}

inline std::string url(const std::string& mode, const std::string& path = "shards/") {
  return "http://127.0.0.1:" + std::to_string(server->proxy) + "/" + mode + "/" + path;
}

// The same through the proxy over HTTPS (its certificate: COLOAD_TLS_CERT, see ScopedEnv).
inline std::string tls_url(const std::string& mode, const std::string& path = "shards/") {
  return "https://127.0.0.1:" + std::to_string(server->proxy_https) + "/" + mode + "/" + path;
}

// Environment variable `name` set to `value` (unset where nullptr) until the scope ends, then
// as it was.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* was = std::getenv(name)) was_ = was;
    if (value) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    if (was_) {
      ::setenv(name_, was_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> was_;
};


// Each sample's key and bytes, in the order streamed.
inline std::vector<std::string> epoch(shards::ShardStream& stream, const WorkerInfo& info) {
  std::vector<std::string> out;
  for (auto& s : stream.samples(info)) {
    if (s.text("bin") != payload(std::stoll(s.text("id")))) {
      throw std::runtime_error("sample " + s.key + " came back altered");
    }
    out.push_back(s.key + '\0' + s.text("id") + '\0' + s.text("bin"));
  }
  return out;
}

// The requests the proxy has had under /<mode>/ so far (serve.py's /count/<mode>).
inline int requests_made(const std::string& mode) {
  return std::stoi(io::HttpClient::shared()->get("http://127.0.0.1:" +
                                                 std::to_string(server->proxy) + "/count/" + mode));
}

inline shards::ShardStreamOptions stream_options(std::size_t read_ahead = 64 << 10) {
  return {.shuffle_shards = true, .shuffle_buffer = 7, .read_ahead = read_ahead};
}

inline std::vector<std::string> local_epoch(const WorkerInfo& info) {
  shards::ShardStream local(*root / "shards", stream_options());
  return epoch(local, info);
}


// The threads of this process now.
inline std::size_t threads_now() {
  return static_cast<std::size_t>(std::distance(fs::directory_iterator("/proc/self/task"),
                                                fs::directory_iterator{}));
}

// The samples' ids as an int64 tensor, each sample checked against what was written.
struct CheckedIds {
  at::Tensor operator()(std::vector<shards::ShardSample> samples) const {
    std::vector<std::int64_t> ids;
    for (const auto& s : samples) {
      const std::int64_t i = std::stoll(s.text("id"));
      if (s.text("bin") != payload(i)) {
        throw std::runtime_error("sample " + std::to_string(i) + " came back altered");
      }
      ids.push_back(i);
    }
    return at::tensor(ids, at::kLong);
  }
};

template <class Loader>
std::vector<std::int64_t> all_ids(Loader& loader) {
  std::vector<std::int64_t> out;
  for (auto& b : loader) {
    const at::Tensor t = b.contiguous();
    out.insert(out.end(), t.data_ptr<std::int64_t>(), t.data_ptr<std::int64_t>() + t.numel());
  }
  return out;
}

}  // namespace remote_test
