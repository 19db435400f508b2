// hardening: doctest's main, and the child mode of the bomb test (a fresh process, whose peak
// RSS the parent measures): `hardening_test --decode-bombs ROOT`.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <filesystem>
#include <string_view>

namespace coload::hardening {
int decode_bombs(const std::filesystem::path& root);
}

int main(int argc, char** argv) {
  if (argc == 3 && std::string_view(argv[1]) == "--decode-bombs") {
    return coload::hardening::decode_bombs(argv[2]) == 0 ? 0 : 1;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
