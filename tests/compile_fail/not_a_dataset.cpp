// A type with neither size()+get() nor stream() is refused, naming the type and the members.
// expect: is_not_a_dataset<NoSize>
// expect: is not a dataset: a map-style dataset needs `size()` and `get(index)`; an iterable one needs `stream(const WorkerInfo&)`
#include "coload/loader/data_loader.hpp"

struct NoSize {
  int get(coload::Index i) const { return static_cast<int>(i); }
};

int main() { auto loader = coload::make_data_loader(NoSize{}, {.batch_size = 2}); }
