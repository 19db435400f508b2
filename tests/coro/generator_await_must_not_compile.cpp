// Must NOT compile: a Generator body may not co_await (checked by a meson test), and the
// compiler must say why: Generator's promise deletes await_transform.
// expect: deleted
// expect: await_transform
#include "coload/coro/generator.hpp"
#include "coload/coro/task.hpp"

coload::Task<int> one() { co_return 1; }
coload::Generator<int> bad() { co_yield co_await one(); }
int main() { return 0; }
