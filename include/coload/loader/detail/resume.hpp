#pragma once
// Resume: where an epoch stands for its consumer, what LoaderState records of it, and what a
// loaded state makes of the next epoch.

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "coload/loader/detail/handoff.hpp"
#include "coload/loader/state.hpp"

namespace coload::detail {

/// Where an epoch stands for its consumer: what LoaderState records of it.
struct EpochPosition {
  std::int64_t epoch = 0;
  DeliveredSet done;
  StreamMarks marks;
  std::vector<std::uint8_t> generator;
  bool ended = false;  // the consumer has seen the epoch's end
};

/// The position of the epoch its consumer stopped last, kept by the loader and every run, so
/// that state() still knows it once the stopped run is gone.
struct StoppedEpoch {
  std::mutex mutex;
  std::optional<EpochPosition> position;
};

/// What the loader keeps between a load_state() and the epoch it resumes, and of the epochs
/// its consumers stopped. Touched by the consumer's thread (state, load) only, but for
/// `stopped`, which runs update under its mutex.
class ResumeBook {
 public:
  /// Shared with every run, which records there where its consumer stopped.
  const std::shared_ptr<StoppedEpoch>& stopped() const noexcept { return stopped_; }

  /// The batches of the next epoch that a loaded state says were delivered, taken once.
  DeliveredSet take_delivered() {
    DeliveredSet out;
    if (delivered_) out = std::move(*delivered_);
    delivered_.reset();
    return out;
  }
  /// The stream marks of the next epoch from a loaded state, taken once.
  std::optional<StreamMarks> take_marks() { return std::exchange(marks_, std::nullopt); }

  /// `identity` filled in with where the loader stands: `running` (the current run's position,
  /// unless its consumer has seen its end), else the epoch its consumer stopped, else the start
  /// of epoch `next_epoch`. A state loaded and not started yet wins over a run still draining.
  LoaderState state(LoaderState s, std::optional<EpochPosition> running, bool have_run,
                    std::int64_t next_epoch, std::vector<std::uint8_t> generator) const {
    std::optional<EpochPosition> at;
    if (delivered_) {
      // Loaded and not started yet: the loaded state, whatever an old run still drains.
    } else if (have_run) {
      at = std::move(running);
    } else {
      // The run is gone: its consumer stopped it, or saw its end.
      std::lock_guard lock(stopped_->mutex);
      if (stopped_->position && stopped_->position->epoch == next_epoch - 1 &&
          !stopped_->position->ended) {
        at = stopped_->position;
      }
    }
    if (at) {
      s.epoch = at->epoch;
      s.delivered = at->done.prefix();
      s.beyond = at->done.beyond();
      s.generator = std::move(at->generator);
      s.streams = streams_of(at->marks);
      s.last_stream = at->marks.last_worker;
    } else if (delivered_) {
      s.epoch = next_epoch;
      s.delivered = delivered_->prefix();
      s.beyond = delivered_->beyond();
      s.generator = std::move(generator);
      if (marks_) {
        s.streams = streams_of(*marks_);
        s.last_stream = marks_->last_worker;
      }
    } else {
      s.epoch = next_epoch;
      s.generator = std::move(generator);
    }
    return s;
  }

  /// Keeps what the next epoch resumes from `saved` (checked compatible by the caller): the
  /// delivered batches of a map-style epoch, or each worker's stream position (its saved
  /// state where `use_states`, else how many of its batches to drop).
  void load(const LoaderState& saved, bool iterable, bool use_states) {
    marks_.reset();
    {
      // Where a stop left the loader is the loaded state's now: a later epoch's stop kept
      // there would hide where the resumed (earlier) epoch is stopped next.
      std::lock_guard lock(stopped_->mutex);
      stopped_->position.reset();
    }
    if (!iterable) {
      delivered_.emplace(saved.delivered, saved.beyond);
      return;
    }
    StreamMarks marks;
    marks.last_worker = saved.last_stream;
    for (const auto& st : saved.streams) {
      marks.counts[st.worker] = st.delivered;
      if (st.state && use_states) marks.states[st.worker] = *st.state;
    }
    marks_.emplace(std::move(marks));
    delivered_.emplace();
  }

 private:
  static std::vector<LoaderState::Stream> streams_of(const StreamMarks& marks) {
    std::vector<LoaderState::Stream> out;
    for (const auto& [w, count] : marks.counts) {
      LoaderState::Stream st;
      st.worker = w;
      st.delivered = count;
      if (auto it = marks.states.find(w); it != marks.states.end()) st.state = it->second;
      out.push_back(std::move(st));
    }
    return out;
  }

  std::optional<DeliveredSet> delivered_;  // set by load(), taken by the next epoch
  std::optional<StreamMarks> marks_;       // the same, for an iterable dataset
  std::shared_ptr<StoppedEpoch> stopped_ = std::make_shared<StoppedEpoch>();
};

}  // namespace coload::detail
