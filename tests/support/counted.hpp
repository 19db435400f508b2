#pragma once
// Counted: a value that tallies its constructions and destructions, so that lifetime tests
// (what a coroutine frame, a generator or a scope destroys, and when) can be exact.

namespace coload::test {

/// Every construction (from a value, copy or move) counts in `constructed`, every destruction
/// in `destroyed`; `alive()` is their difference. Call `reset()` at the start of a test.
struct Counted {
  static inline int constructed = 0;
  static inline int destroyed = 0;
  static void reset() { constructed = destroyed = 0; }
  static int alive() { return constructed - destroyed; }

  int value;
  explicit Counted(int v) : value(v) { ++constructed; }
  Counted(const Counted& o) : value(o.value) { ++constructed; }
  Counted(Counted&& o) noexcept : value(o.value) { ++constructed; }
  ~Counted() { ++destroyed; }
};

}  // namespace coload::test
