#pragma once
// serve.py (nginx and the fault-injecting proxy on 127.0.0.1) started from a C++ test or
// benchmark: its ports, or the reason it cannot run; it stops when this object is destroyed.

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>

extern char** environ;

namespace shards_test {

// serve.py over one folder: nginx and the proxy, until the pipe to its stdin closes.
struct Server {
  pid_t pid = -1;
  int to_child = -1;
  int nginx = 0, proxy = 0;
  int nginx_https = 0, proxy_https = 0;  // serve.py's over HTTPS (0: none, as s3_serve.py's)
  std::string skip;
  std::string key_id, key_secret;

  void start(const std::filesystem::path& script, const std::filesystem::path& root) {
    int in[2], out[2];
    // Close-on-exec: a process forked later must not hold serve.py's stdin open.
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
      throw std::runtime_error("pipe failed");
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addclose(&fa, in[1]);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    std::string py = "python3", s = script.string(), r = root.string();
    char* argv[] = {py.data(), s.data(), r.data(), nullptr};
    if (posix_spawnp(&pid, "python3", &fa, nullptr, argv, environ) != 0) {
      throw std::runtime_error("cannot start python3 " + s);
    }
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    to_child = in[1];
    FILE* f = ::fdopen(out[0], "r");
    char line[512] = {};
    if (!std::fgets(line, sizeof line, f)) throw std::runtime_error("serve.py said nothing");
    std::fclose(f);
    std::string text(line);
    if (text.rfind("SKIP ", 0) == 0) {
      skip = text.substr(5);
    } else if (char id[128] = {}, secret[128] = {};
               std::sscanf(line, "PORTS %d %d %127s %127s %d %d", &nginx, &proxy, id, secret,
                           &nginx_https, &proxy_https) >= 2) {
      // s3_serve.py: the access key its server checks signatures with ("-": serve.py's none)
      if (std::string(id) != "-") {
        key_id = id;
        key_secret = secret;
      }
    } else {
      throw std::runtime_error("serve.py said '" + text + "'");
    }
  }
  ~Server() {
    if (to_child >= 0) ::close(to_child);  // serve.py stops nginx and exits
    if (pid > 0) ::waitpid(pid, nullptr, 0);
  }
};

}  // namespace shards_test
