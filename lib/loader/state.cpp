// LoaderState: its text form, saving and loading, and the checks of a resumed state.

#include "coload/loader/state.hpp"
#include "coload/core/error.hpp"
#include "coload/io/whole_file.hpp"

#include "coload/loader/errors.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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

/// Refuses `value` outside [lo, hi], naming the field.
template <class T>
T in_range(std::string_view key, T value, std::int64_t lo, std::int64_t hi) {
  if (static_cast<std::int64_t>(value) < lo || static_cast<std::int64_t>(value) > hi) {
    throw InvalidArgument("loader state: " + std::string(key) + " " + std::to_string(value) +
                          " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) +
                          "]");
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
  if (base_seed) out << "base_seed " << *base_seed << '\n';
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
      s.epoch = in_range(key, number<std::int64_t>(key, value), 0, max_count), seen |= k_epoch;
    } else if (key == "delivered") {
      s.delivered = in_range(key, number<std::int64_t>(key, value), 0, max_count);
      seen |= k_delivered;
    } else if (key == "beyond") {
      std::string_view rest = value;
      while (!rest.empty()) {
        const auto p = rest.find(' ');
        const auto n = number<std::int64_t>(key, rest.substr(0, p));
        s.beyond.push_back(in_range(key, n, 0, max_count));
        rest = p == std::string_view::npos ? std::string_view{} : rest.substr(p + 1);
      }
      seen |= k_beyond;
    } else if (key == "dataset_size") {
      s.dataset_size = in_range(key, number<std::int64_t>(key, value), -1, max_count);
      seen |= k_size;
    } else if (key == "batch_size") {
      s.batch_size = in_range(key, number<std::int64_t>(key, value), -1, max_count);
      if (s.batch_size == 0) {
        throw InvalidArgument("loader state: batch_size 0 is not -1 or positive");
      }
      seen |= k_batch;
    } else if (key == "seed") {
      if (value != "none") s.seed = number<std::uint64_t>(key, value);
      seen |= k_seed;
    } else if (key == "rank") {
      s.rank = in_range(key, number<int>(key, value), 0, max_world_size - 1), seen |= k_rank;
    } else if (key == "world_size") {
      s.world_size = in_range(key, number<int>(key, value), 1, max_world_size), seen |= k_world;
    } else if (key == "base_seed") {
      s.base_seed = number<std::uint64_t>(key, value);
    } else if (key == "generator") {
      s.generator = unhex(value), seen |= k_gen;
    } else if (key == "stream_workers") {
      s.stream_workers = in_range(key, number<std::int64_t>(key, value), -1, max_workers);
    } else if (key == "last_stream") {
      s.last_stream = in_range(key, number<int>(key, value), -1, max_workers - 1);
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
      st.worker = in_range("stream worker", number<int>(key, value.substr(0, p1)), 0,
                           max_workers - 1);
      st.delivered = in_range("stream delivered",
                              number<std::int64_t>(key, value.substr(p1 + 1, p2 - p1 - 1)), 0,
                              max_count);
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
  if (s.rank >= s.world_size) {
    throw InvalidArgument("loader state: rank " + std::to_string(s.rank) +
                          " is not below world_size " + std::to_string(s.world_size));
  }
  for (const auto& st : s.streams) {
    if (st.worker >= std::max<std::int64_t>(s.stream_workers, 1)) {
      throw InvalidArgument("loader state: stream worker " + std::to_string(st.worker) +
                            " is not below stream_workers " + std::to_string(s.stream_workers));
    }
  }
  if (s.last_stream >= std::max<std::int64_t>(s.stream_workers, 1)) {
    throw InvalidArgument("loader state: last_stream " + std::to_string(s.last_stream) +
                          " is not below stream_workers " + std::to_string(s.stream_workers));
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
  const std::string where = "loading the loader state: ";
  const std::string name = path.string();
  const std::string limit = std::to_string(max_file_size) + " bytes (1 MiB)";
  io::WholeFile file = io::read_whole_file(path, static_cast<std::uint64_t>(max_file_size));
  using Status = io::WholeFile::Status;
  const auto system = [&](const char* step) {
    return SystemError(file.error, std::generic_category(), where + step + name);
  };
  switch (file.status) {
    case Status::read: break;
    case Status::cannot_open: throw system("cannot open ");
    case Status::cannot_stat: throw system("cannot stat ");
    case Status::cannot_read: throw system("cannot read ");
    case Status::not_regular: throw InvalidArgument(where + name + " is " + file.what);
    case Status::too_big:
      throw InvalidArgument(where + name + " has " + std::to_string(file.size) +
                            " bytes, more than a state's limit of " + limit);
    case Status::grew:
      throw InvalidArgument(where + name + " grew past a state's limit of " + limit);
  }
  const std::string& text = file.bytes;
  try {
    return parse(text);
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
