// LoaderState: its text form, saving and loading, and the checks of a resumed state.

#include "coload/loader/state.hpp"
#include "coload/core/error.hpp"

#include "coload/loader/errors.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <system_error>

namespace coload {

namespace {

constexpr std::string_view magic = "coload-loader-state";

std::string hex(const std::vector<std::uint8_t>& bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (auto b : bytes) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

std::vector<std::uint8_t> unhex(std::string_view text) {
  auto value = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw InvalidArgument("loader state: generator is not hexadecimal");
  };
  if (text.size() % 2) throw InvalidArgument("loader state: generator has an odd length");
  std::vector<std::uint8_t> out(text.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<std::uint8_t>(value(text[2 * i]) * 16 + value(text[2 * i + 1]));
  }
  return out;
}

template <class T>
T number(std::string_view key, std::string_view text) {
  T value{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size()) {
    throw InvalidArgument("loader state: " + std::string(key) + " is not a number: '" +
                          std::string(text) + "'");
  }
  return value;
}

at::Generator resolve(const std::optional<at::Generator>& gen) {
  return gen ? *gen : at::detail::getDefaultCPUGenerator();
}

}  // namespace

std::string LoaderState::to_string() const {
  std::ostringstream out;
  out << magic << ' ' << version << '\n';
  out << "epoch " << epoch << '\n';
  out << "delivered " << delivered << '\n';
  out << "beyond";
  for (auto n : beyond) out << ' ' << n;
  out << '\n';
  out << "dataset_size " << dataset_size << '\n';
  out << "batch_size " << batch_size << '\n';
  out << "seed " << (seed ? std::to_string(*seed) : std::string("none")) << '\n';
  out << "rank " << rank << '\n';
  out << "world_size " << world_size << '\n';
  out << "generator " << hex(generator) << '\n';
  out << "stream_workers " << stream_workers << '\n';
  out << "last_stream " << last_stream << '\n';
  for (const auto& st : streams) {
    out << "stream " << st.worker << ' ' << st.delivered << ' '
        << (st.state ? hex(std::vector<std::uint8_t>(st.state->begin(), st.state->end()))
                     : std::string("-"))
        << '\n';
  }
  return out.str();
}

LoaderState LoaderState::parse(std::string_view text) {
  LoaderState s;
  s.version = -1;
  unsigned seen = 0;
  enum : unsigned { k_epoch = 1, k_delivered = 2, k_beyond = 4, k_size = 8, k_batch = 16,
                    k_seed = 32, k_rank = 64, k_world = 128, k_gen = 256, k_all = 511 };
  bool first = true;
  while (!text.empty()) {
    const auto eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view{} : text.substr(eol + 1);
    if (line.empty()) continue;
    const auto sp = line.find(' ');
    const std::string_view key = line.substr(0, sp);
    const std::string_view value = sp == std::string_view::npos ? "" : line.substr(sp + 1);
    if (first) {
      if (key != magic) {
        throw InvalidArgument("loader state: not a coload loader state (it starts with '" +
                              std::string(key) + "')");
      }
      s.version = number<int>("version", value);
      if (s.version != current_version) {
        throw InvalidArgument("loader state: version " + std::to_string(s.version) +
                              " is not this coload's version " + std::to_string(current_version));
      }
      first = false;
      continue;
    }
    if (key == "epoch") {
      s.epoch = number<std::int64_t>(key, value), seen |= k_epoch;
    } else if (key == "delivered") {
      s.delivered = number<std::int64_t>(key, value), seen |= k_delivered;
    } else if (key == "beyond") {
      std::string_view rest = value;
      while (!rest.empty()) {
        const auto p = rest.find(' ');
        s.beyond.push_back(number<std::int64_t>(key, rest.substr(0, p)));
        rest = p == std::string_view::npos ? std::string_view{} : rest.substr(p + 1);
      }
      seen |= k_beyond;
    } else if (key == "dataset_size") {
      s.dataset_size = number<std::int64_t>(key, value), seen |= k_size;
    } else if (key == "batch_size") {
      s.batch_size = number<std::int64_t>(key, value), seen |= k_batch;
    } else if (key == "seed") {
      if (value != "none") s.seed = number<std::uint64_t>(key, value);
      seen |= k_seed;
    } else if (key == "rank") {
      s.rank = number<int>(key, value), seen |= k_rank;
    } else if (key == "world_size") {
      s.world_size = number<int>(key, value), seen |= k_world;
    } else if (key == "generator") {
      s.generator = unhex(value), seen |= k_gen;
    } else if (key == "stream_workers") {
      s.stream_workers = number<std::int64_t>(key, value);
    } else if (key == "last_stream") {
      s.last_stream = number<int>(key, value);
    } else if (key == "stream") {
      // stream <worker> <delivered> <hex state | ->
      const auto p1 = value.find(' ');
      const auto p2 = p1 == std::string_view::npos ? p1 : value.find(' ', p1 + 1);
      if (p2 == std::string_view::npos) {
        throw InvalidArgument(
            "loader state: a stream line needs a worker, a count and a "
            "state: '" +
            std::string(value) + "'");
      }
      LoaderState::Stream st;
      st.worker = number<int>(key, value.substr(0, p1));
      st.delivered = number<std::int64_t>(key, value.substr(p1 + 1, p2 - p1 - 1));
      if (const auto text = value.substr(p2 + 1); text != "-") {
        const auto bytes = unhex(text);
        st.state.emplace(bytes.begin(), bytes.end());
      }
      s.streams.push_back(std::move(st));
    } else {
      throw InvalidArgument("loader state: unknown field '" + std::string(key) + "'");
    }
  }
  if (first) throw InvalidArgument("loader state: empty");
  if (seen != k_all) {
    static constexpr const char* names[] = {"epoch", "delivered", "beyond",
                                            "dataset_size", "batch_size", "seed",
                                            "rank", "world_size", "generator"};
    for (unsigned i = 0; i < 9; ++i) {
      if (!(seen & (1u << i))) {
        throw InvalidArgument(std::string("loader state: the field '") + names[i] + "' is missing");
      }
    }
  }
  if (s.epoch < 0 || s.delivered < 0) {
    throw InvalidArgument("loader state: negative epoch or delivered count");
  }
  return s;
}

void LoaderState::save(const std::filesystem::path& path) const {
  const std::string text = to_string();
  std::filesystem::path tmp = path;
  tmp += ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw SystemError(errno, std::generic_category(),
                      "saving the loader state: cannot create " + tmp.string());
  }
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw SystemError(e, std::generic_category(),
                        "saving the loader state: cannot write " + tmp.string());
    }
    done += static_cast<std::size_t>(n);
  }
  // The rename must not reach the disk before the data does.
  if (::fdatasync(fd) != 0 || ::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw SystemError(e, std::generic_category(),
                      "saving the loader state: cannot flush " + tmp.string());
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw SystemError(
        e, std::generic_category(),
        "saving the loader state: cannot rename " + tmp.string() + " to " + path.string());
  }
}

LoaderState LoaderState::load(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw SystemError(errno, std::generic_category(),
                      "loading the loader state: cannot open " + path.string());
  }
  std::ostringstream text;
  text << in.rdbuf();
  try {
    return parse(text.str());
  } catch (const std::invalid_argument& e) {
    throw InvalidArgument(path.string() + ": " + e.what());
  }
}

namespace detail {

std::vector<std::uint8_t> generator_state(const std::optional<at::Generator>& gen) {
  at::Generator g = resolve(gen);
  at::Tensor t;
  {
    std::lock_guard lock(g.mutex());
    t = g.get_state();
  }
  const auto* p = t.data_ptr<std::uint8_t>();
  return {p, p + t.numel()};
}

void set_generator_state(const std::optional<at::Generator>& gen,
                         const std::vector<std::uint8_t>& state) {
  at::Generator g = resolve(gen);
  auto t = at::empty({static_cast<std::int64_t>(state.size())}, at::kByte);
  std::copy(state.begin(), state.end(), t.data_ptr<std::uint8_t>());
  try {
    std::lock_guard lock(g.mutex());
    g.set_state(t);
  } catch (const std::exception& e) {
    throw InvalidArgument(std::string("loader state: the generator state is not valid: ") +
                          e.what());
  }
}

void check_compatible(const LoaderState& saved, const LoaderState& expected) {
  auto refuse = [](const std::string& what, const std::string& saved_value,
                   const std::string& value) {
    throw InvalidArgument("loader state: it was saved by a loader with " + what + " " +
                          saved_value + ", but this loader has " + value);
  };
  auto seed = [](const std::optional<std::uint64_t>& s) {
    return s ? std::to_string(*s) : std::string("no seed");
  };
  if (saved.version != expected.version) {
    refuse("state version", std::to_string(saved.version), std::to_string(expected.version));
  }
  if (saved.dataset_size != expected.dataset_size) {
    refuse("dataset size", std::to_string(saved.dataset_size),
           std::to_string(expected.dataset_size));
  }
  if (saved.batch_size != expected.batch_size) {
    refuse("batch_size", std::to_string(saved.batch_size), std::to_string(expected.batch_size));
  }
  if (saved.seed != expected.seed) refuse("seed", seed(saved.seed), seed(expected.seed));
  if (saved.stream_workers != expected.stream_workers) {
    refuse("num_workers (for an iterable dataset)", std::to_string(saved.stream_workers),
           std::to_string(expected.stream_workers));
  }
  if (saved.world_size != expected.world_size) {
    refuse("world size", std::to_string(saved.world_size), std::to_string(expected.world_size));
  }
  if (saved.rank != expected.rank) {
    refuse("rank", std::to_string(saved.rank), std::to_string(expected.rank));
  }
}

void warn_fast_forward(std::int64_t batches) {
  warn_once("fast-forward", "resuming an iterable dataset that has no state()/load_state(): "
                            "fast-forwarding by loading and dropping the " +
                                std::to_string(batches) + " batches already delivered");
}

}  // namespace detail

}  // namespace coload
