#pragma once
// LoaderState: where a DataLoader stands between two batches, to resume it in another process.

#include <ATen/core/Generator.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace coload {

/// Where a loader stands between two batches: the epoch in progress, which of its batches the
/// consumer has had, and the random state the epoch's draws started from. Made by
/// DataLoader::state(); a fresh loader over the same dataset with the same options given it
/// (DataLoader::load_state) delivers exactly the batches that had not been delivered, then the
/// following epochs as the uninterrupted run would.
///
/// Serialised as a few lines of text (to_string(), parse()); save() writes a file atomically.
struct LoaderState {
  /// The format's version; a state of another version is refused.
  static constexpr int current_version = 1;
  int version = current_version;

  /// The epoch in progress (or, between epochs, the next one to start).
  std::int64_t epoch = 0;
  /// Batches of that epoch already delivered: all numbers below `delivered`, and `beyond`
  /// (batches delivered out of order with `in_order = false`, or skipped ones).
  std::int64_t delivered = 0;
  std::vector<std::int64_t> beyond;
  /// The loader's random generator (`seed` set) or ATen's default one (unset) when the epoch
  /// began: the epoch's base seed and the shuffle are drawn from it again.
  std::vector<std::uint8_t> generator;
  /// With persistent_workers: the workers' base seed, drawn by an earlier epoch (PyTorch's
  /// loader draws it once, in its first epoch, and the generator's later draws are the
  /// sampler's alone). Unset: the epoch draws it, from `generator`.
  std::optional<std::uint64_t> base_seed;
  /// An iterable dataset: for each worker, how many of its batches were delivered and (with
  /// state()/load_state() members) its stream's state after the last of them; and the worker
  /// of the last delivered batch (the rotation goes on after it).
  struct Stream {
    int worker = 0;
    std::int64_t delivered = 0;
    std::optional<std::string> state;
    friend bool operator==(const Stream&, const Stream&) = default;
  };
  std::vector<Stream> streams;
  int last_stream = -1;

  // What the state must match in the loader that loads it.
  /// The dataset's size; -1 for an iterable dataset without one.
  std::int64_t dataset_size = -1;
  /// The batch size; -1 without automatic batching.
  std::int64_t batch_size = -1;
  std::optional<std::uint64_t> seed;
  /// An iterable dataset's num_workers (its shards and streams depend on it); -1 map-style.
  std::int64_t stream_workers = -1;
  /// The distributed rank and world size the loader ran with.
  int rank = 0;
  int world_size = 1;

  /// The largest epoch, batch count, batch number, dataset size or batch size a state may hold
  /// (2^53): beyond any real run, and far enough from INT64_MAX that nothing derived from it
  /// overflows. parse() refuses larger numbers, naming the field.
  static constexpr std::int64_t max_count = std::int64_t{1} << 53;
  /// The most workers (stream_workers) and the largest world size a state may hold.
  static constexpr std::int64_t max_workers = 1 << 16;
  static constexpr std::int64_t max_world_size = 1 << 24;
  /// load() refuses a file larger than this (1 MiB; a state takes a few KiB, plus one line
  /// per worker and the stream states of an iterable dataset).
  static constexpr std::int64_t max_file_size = std::int64_t{1} << 20;

  /// The state as text, one `key value` line per field.
  std::string to_string() const;
  /// Reads to_string()'s text; InvalidArgument names a malformed, missing or out-of-range field.
  static LoaderState parse(std::string_view text);
  /// Writes the state to `path` atomically: a temporary file in the same folder, flushed to
  /// disk, then renamed over `path`. std::system_error names the path.
  void save(const std::filesystem::path& path) const;
  /// Reads a state written by save(). Opens only a regular file (a FIFO, a device or a folder
  /// is refused at once, without reading it) of at most max_file_size bytes; every error names
  /// the path.
  static LoaderState load(const std::filesystem::path& path);
};

namespace detail {
/// The state of `gen`, or of ATen's default CPU generator when empty.
std::vector<std::uint8_t> generator_state(const std::optional<at::Generator>& gen);
/// Sets `gen` (or ATen's default CPU generator when empty) to `state`.
void set_generator_state(const std::optional<at::Generator>& gen,
                         const std::vector<std::uint8_t>& state);
/// Refuses `saved` for a loader described by `expected` (only the identity fields are
/// compared), with a std::invalid_argument naming the first mismatch.
void check_compatible(const LoaderState& saved, const LoaderState& expected);
/// Says once per process, on stderr, that an iterable dataset is fast-forwarded.
void warn_fast_forward(std::int64_t batches);
}  // namespace detail

}  // namespace coload
