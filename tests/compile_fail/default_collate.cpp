// Samples default_collate has no Collate<T> for are refused, naming the sample type.
// expect: default_collate_cannot_batch<MySample>
// expect: default_collate cannot batch
// expect: or pass `.collate`
#include "coload/loader/data_loader.hpp"

struct MySample {
  int label;
};
struct Data {
  coload::Index size() const { return 4; }
  MySample get(coload::Index i) const { return {static_cast<int>(i)}; }
};

int main() { auto loader = coload::make_data_loader(Data{}, {.batch_size = 2}); }
