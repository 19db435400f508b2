#pragma once
// Compile-time errors that speak: each struct here exists only to fail, so that the compiler's
// first lines name the user's type ("In instantiation of 'struct
// coload::diagnose::is_not_a_dataset<NoSize>'") and the static_assert under it says what to do.
//
// NOTE: C++20's static_assert takes only a string literal, so the type cannot be spliced into
// the message itself; the instantiation line above it names it.

namespace coload::diagnose {

template <class T>
inline constexpr bool always_false = false;

/// make_data_loader was given something that is neither a map-style nor an iterable dataset.
template <class D>
struct is_not_a_dataset {
  static_assert(always_false<D>,
                "coload: `D` (named above, in is_not_a_dataset<D>) is not a dataset: a map-style "
                "dataset needs `size()` and `get(index)`; an iterable one needs "
                "`stream(const WorkerInfo&)`");
  static constexpr bool value = false;
};

/// The default collate was asked to batch samples it has no Collate<T> for.
template <class Sample>
struct default_collate_cannot_batch {
  static_assert(always_false<Sample>,
                "coload: default_collate cannot batch `Sample` (named above, in "
                "default_collate_cannot_batch<Sample>): specialise `coload::Collate<Sample>` or "
                "pass `.collate`");
  static constexpr bool value = false;
};

}  // namespace coload::diagnose
