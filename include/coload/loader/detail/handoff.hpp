#pragma once
// The hand-off between the driver (which delivers batches) and the one consumer of an epoch.

#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "coload/core/metrics.hpp"

namespace coload::detail {

/// The batch numbers of an epoch that are done with, as a prefix `0 .. prefix() - 1` and the
/// numbers beyond it (done out of order, with `in_order = false`).
class DeliveredSet {
 public:
  DeliveredSet() = default;
  DeliveredSet(std::int64_t prefix, const std::vector<std::int64_t>& beyond) : prefix_(prefix) {
    for (auto n : beyond) add(n);
  }
  void add(std::int64_t n) {
    if (n < prefix_) return;
    if (n != prefix_) {
      beyond_.insert(n);
      return;
    }
    ++prefix_;
    while (!beyond_.empty() && *beyond_.begin() == prefix_) {
      beyond_.erase(beyond_.begin());
      ++prefix_;
    }
  }
  bool contains(std::int64_t n) const { return n < prefix_ || beyond_.count(n) != 0; }
  std::int64_t prefix() const noexcept { return prefix_; }
  std::vector<std::int64_t> beyond() const { return {beyond_.begin(), beyond_.end()}; }

 private:
  std::int64_t prefix_ = 0;
  std::set<std::int64_t> beyond_;
};

/// One delivered item: a batch, or the error that took its place.
template <class Batch>
struct Outcome {
  std::optional<Batch> batch;
  std::exception_ptr error;
  /// The batch's number in its epoch; -1 for an error that ends the epoch (not a batch's).
  std::int64_t number = -1;
  /// An iterable dataset's state (its state() member) right after this batch's samples, and
  /// the worker whose stream it is: where that stream resumes once the batch was delivered.
  std::shared_ptr<const std::string> stream_state;
  int stream_worker = -1;
  /// Nothing came for it because it was queued on a worker process that died (whose
  /// WorkerDied the batch before it carries): it keeps its place, and is not delivered, so a
  /// state saved after it lets a resumed epoch fetch it again.
  bool lost = false;
};

/// Where each worker's stream of an iterable dataset stands after the batches its consumer
/// has taken: how many it took from each worker (batches and errors), each stream's state
/// (datasets with state()), and the worker of the last of them.
struct StreamMarks {
  std::map<int, std::int64_t> counts;
  std::map<int, std::string> states;
  int last_worker = -1;
};

/// What a consumer's poll found.
enum class Poll { item, end, timeout, wait };

/// Where a waiting consumer receives its result: written under the hand-off's lock before the
/// consumer is woken, read by the consumer after it resumes.
template <class Batch>
struct ConsumerSlot {
  Poll result = Poll::wait;
  Outcome<Batch> outcome;
  std::uint64_t asked_ns = 0;  ///< when the consumer asked (metrics; 0: not timed)
};

/// A thread-safe, single-consumer queue of delivered outcomes. At most one consumer waits at a
/// time; the driver wakes it by calling its waker outside the lock.
template <class Batch>
class Handoff {
 public:
  using Waker = std::function<void()>;

  /// Consumer: fills `slot` at once (returns false) or registers `waker` and returns true, in
  /// which case `on_wait(generation, batch)` runs under the lock (it must not touch the
  /// consumer). `batch` is the one waited for (awaited()).
  template <class OnWait>
  bool poll_or_wait(ConsumerSlot<Batch>& slot, Waker waker, OnWait&& on_wait) {
    std::lock_guard lock(mutex_);
    if (take_locked(slot)) return false;
    slot.result = Poll::wait;
    slot_ = &slot;
    waker_ = std::move(waker);
    wait_since_ = now_ns();
    try {
      on_wait(++generation_, passed_.prefix());
    } catch (...) {
      release_locked();  // the consumer will not be waiting: forget its slot
      throw;
    }
    return true;
  }

  /// Driver: appends an outcome and wakes a waiting consumer.
  void push(Outcome<Batch> outcome) {
    Waker wake;
    {
      std::lock_guard lock(mutex_);
      ready_.push_back(std::move(outcome));
      if (slot_) {
        take_locked(*slot_);
        wake = release_locked();
      }
    }
    if (wake) wake();
  }

  /// Driver: no more outcomes will come; wakes a waiting consumer with the end.
  void finish() {
    Waker wake;
    {
      std::lock_guard lock(mutex_);
      finished_ = true;
      if (slot_) {
        take_locked(*slot_);
        wake = release_locked();
      }
    }
    if (wake) wake();
  }

  /// Driver: wakes the consumer with a timeout if it is still in wait `generation`.
  void expire(std::uint64_t generation) {
    Waker wake;
    {
      std::lock_guard lock(mutex_);
      if (!slot_ || generation != generation_) return;
      slot_->result = Poll::timeout;
      wake = release_locked();
    }
    wake();
  }

  /// The nanoseconds the consumer has spent waiting for an item, a wait in progress
  /// included (any thread). Costs a clock read per wait, none per item taken at once.
  std::int64_t wait_nanoseconds() const {
    std::lock_guard lock(mutex_);
    return wait_ns_ + (wait_since_ >= 0 ? now_ns() - wait_since_ : 0);
  }

  /// How many items the consumer has taken.
  std::int64_t taken() const {
    std::lock_guard lock(mutex_);
    return taken_;
  }
  /// True once the consumer has seen the end.
  bool ended() const {
    std::lock_guard lock(mutex_);
    return ended_;
  }

  /// Driver: batch `number` has nothing for the consumer (every sample skipped, or delivered
  /// before a resume): it counts as done.
  void note_done(std::int64_t number) {
    std::lock_guard lock(mutex_);
    done_.add(number);
    passed_.add(number);
  }
  /// Driver: batch `number` was lost with a worker process: not done (a state saved later
  /// fetches it again), and not waited for either.
  void note_lost(std::int64_t number) {
    std::lock_guard lock(mutex_);
    passed_.add(number);
  }
  /// The batch a waiting consumer waits for: the first neither done nor lost. Not the count
  /// taken, which a resumed epoch, skipped batches or `in_order = false` set apart from it.
  std::int64_t awaited() const {
    std::lock_guard lock(mutex_);
    return passed_.prefix();
  }
  /// Driver, before the first push: the batches a resumed epoch had delivered already.
  void set_done(DeliveredSet done) {
    std::lock_guard lock(mutex_);
    passed_ = done;
    done_ = std::move(done);
  }
  /// The batch numbers the consumer has taken (or that had nothing for it).
  DeliveredSet done() const {
    std::lock_guard lock(mutex_);
    return done_;
  }
  /// Driver, before the first push: the stream positions a resumed epoch starts from.
  void set_marks(StreamMarks marks) {
    std::lock_guard lock(mutex_);
    marks_ = std::move(marks);
  }
  /// The stream positions after the batches the consumer has taken.
  StreamMarks marks() const {
    std::lock_guard lock(mutex_);
    return marks_;
  }

 private:
  bool take_locked(ConsumerSlot<Batch>& slot) {
    if (!ready_.empty()) {
      slot.outcome = std::move(ready_.front());
      ready_.pop_front();
      slot.result = Poll::item;
      ++taken_;
      if (slot.outcome.number >= 0) {
        done_.add(slot.outcome.number);
        passed_.add(slot.outcome.number);
      }
      if (const int w = slot.outcome.stream_worker; w >= 0) {
        ++marks_.counts[w];
        if (slot.outcome.stream_state) marks_.states[w] = *slot.outcome.stream_state;
        marks_.last_worker = w;
      }
      return true;
    }
    if (finished_) {
      slot.result = Poll::end;
      ended_ = true;
      return true;
    }
    return false;
  }
  static std::int64_t now_ns() noexcept { return static_cast<std::int64_t>(detail::now_ns()); }
  Waker release_locked() {
    if (wait_since_ >= 0) wait_ns_ += now_ns() - std::exchange(wait_since_, -1);
    slot_ = nullptr;
    return std::exchange(waker_, nullptr);
  }

  mutable std::mutex mutex_;
  std::deque<Outcome<Batch>> ready_;
  bool finished_ = false;
  bool ended_ = false;
  std::int64_t taken_ = 0;
  DeliveredSet done_;
  DeliveredSet passed_;  // done_, and the batches lost with a worker
  StreamMarks marks_;
  ConsumerSlot<Batch>* slot_ = nullptr;
  Waker waker_;
  std::uint64_t generation_ = 0;
  std::int64_t wait_ns_ = 0;      // the consumer's finished waits
  std::int64_t wait_since_ = -1;  // when its current wait began (-1: not waiting)
};

}  // namespace coload::detail
