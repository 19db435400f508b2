#pragma once
// The coroutine core: Task, Generator, AsyncGenerator, sync_wait, when_all, AsyncScope and
// Detached.

#include "coload/coro/async_generator.hpp"
#include "coload/coro/async_scope.hpp"
#include "coload/coro/detached.hpp"
#include "coload/coro/generator.hpp"
#include "coload/coro/sync_wait.hpp"
#include "coload/coro/task.hpp"
#include "coload/coro/when_all.hpp"
