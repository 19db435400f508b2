// A custom collate in braced options of the default type says how to pass it.
// expect: a custom `.collate` cannot go into braced options
// expect: make_data_loader(dataset, {...}, collate)
#include <vector>

#include "coload/loader/data_loader.hpp"

struct Data {
  coload::Index size() const { return 4; }
  int get(coload::Index i) const { return static_cast<int>(i); }
};
struct Sum {
  int operator()(std::vector<int> samples) const { return static_cast<int>(samples.size()); }
};

int main() {
  auto loader = coload::make_data_loader(Data{}, {.batch_size = 2, .collate = Sum{}});
}
