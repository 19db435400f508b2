#pragma once
// The reorder ring: batches that complete out of order wait here until every batch before
// them has, as libtorch's OrderedSequencer restores a DataLoader's order.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace coload::detail {

/// Holds completed items by number and releases them in number order. Driver only.
///
/// Why two items in the ring never share a slot: item n goes to slot n % capacity. The run
/// dispatches item n only while fewer than its in-flight bound of items are between dispatch
/// and the consumer, and that bound is at most `capacity` (it moves with the worker count under
/// auto_workers, never above the count the ring was sized for). Every item not yet released
/// is one of those in flight, so the items waiting here all lie in [next, next + capacity),
/// where `next` is the number the ring releases next; within one such window no two numbers
/// have the same remainder.
template <class T>
class ReorderRing {
 public:
  explicit ReorderRing(std::int64_t capacity) : slots_(static_cast<std::size_t>(capacity)) {}

  /// Item `number` has completed (numbers in [next(), next() + capacity)).
  void put(std::int64_t number, T item) { slot(number).emplace(std::move(item)); }

  /// Hands each item that is next in order to `deliver`, as long as there is one.
  template <class F>
  void release(F&& deliver) {
    for (;;) {
      auto& s = slot(next_);
      if (!s) return;
      T item = std::move(*s);
      s.reset();
      ++next_;
      deliver(std::move(item));
    }
  }

  /// The number released next.
  std::int64_t next() const noexcept { return next_; }

 private:
  std::optional<T>& slot(std::int64_t number) {
    return slots_[static_cast<std::size_t>(number % static_cast<std::int64_t>(slots_.size()))];
  }

  std::vector<std::optional<T>> slots_;
  std::int64_t next_ = 0;
};

}  // namespace coload::detail
