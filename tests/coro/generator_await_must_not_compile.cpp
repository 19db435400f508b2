// Must NOT compile: a Generator body may not co_await (checked by a meson test).
#include "coload/coro/generator.hpp"
#include "coload/coro/task.hpp"

coload::Task<int> one() { co_return 1; }
coload::Generator<int> bad() { co_yield co_await one(); }
int main() { return 0; }
