#pragma once
// Detached: the one fire-and-forget coroutine type.

#include <coroutine>
#include <exception>

namespace coload {

/// A coroutine nobody awaits: its body starts at once, on the calling thread, and its frame
/// frees itself when the body ends.
///
/// Contract: the body must catch what it can recover from; an exception escaping it calls
/// std::terminate (there is nobody to hand it to). Parameters taken by reference must outlive
/// the body, which may run long after the call returns: take by value, or write down who keeps
/// the referent alive. To wait for detached work, spawn a Task into an AsyncScope instead.
struct Detached {
  struct promise_type {
    /// Returns an empty handle: the caller cannot reach the frame.
    Detached get_return_object() const noexcept { return {}; }
    /// Runs the body at once.
    std::suspend_never initial_suspend() const noexcept { return {}; }
    /// Frees the frame as the body ends.
    std::suspend_never final_suspend() const noexcept { return {}; }
    /// Nothing to store.
    void return_void() const noexcept {}
    /// An escaped exception has no owner: terminate.
    void unhandled_exception() const noexcept { std::terminate(); }
  };
};

}  // namespace coload
