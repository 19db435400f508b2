#pragma once
// Test cases that need what a machine may lack (a usable CUDA device; torchvision to compute a
// reference) are decided when they are registered, before main, since doctest 2.4 can skip a
// case only then. A case whose need is not met is skipped, so the summary counts it under
// "skipped" (a case that printed a message and returned was counted as passed), and a listener
// prints its name and the reason. Where the environment variable the need names is set to
// anything but 0 (tools/test sets COLOAD_REQUIRE_REFERENCES, tools/gpu/run.sh
// COLOAD_REQUIRE_CUDA), the case runs instead and fails at its start with the same reason: a
// machine meant to check it cannot pass without checking it.
//
//   TEST_CASE("GPU: ..." * coload::testing::needs(coload::testing::cuda())) {
//     coload::testing::require(coload::testing::cuda());
//     ...

#include <doctest/doctest.h>

#include <cstdlib>
#include <exception>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>

#include "coload/device/backend.hpp"

namespace coload::testing {

/// Something a test needs, checked once: met, or the reason it is not.
class Need {
 public:
  /// `missing` is empty when the need is met, else why it is not ("no CUDA device: ...").
  Need(const char* env, std::string missing) : env_(env), missing_(std::move(missing)) {
    if (!met()) skip_text_ = "skipped: " + missing_ + " (set " + env_ + "=1 to make this a failure)";
  }
  bool met() const noexcept { return missing_.empty(); }
  /// The variable that turns the skip into a failure.
  const char* env() const noexcept { return env_; }
  /// Whether that variable asks for the need to be met.
  bool required() const noexcept {
    const char* v = std::getenv(env_);
    return v && *v && std::string_view(v) != "0";
  }
  const std::string& missing() const noexcept { return missing_; }
  /// The description a skipped case carries; stable for the life of the process.
  const char* skip_text() const noexcept { return skip_text_.c_str(); }

 private:
  const char* env_;
  std::string missing_;
  std::string skip_text_;
};

/// A doctest decorator: skips the case, with the reason as its description, where `need` is not
/// met and not required.
struct needs {
  const Need& need;
  void fill(doctest::detail::TestCase& tc) const {
    if (!need.met() && !need.required()) {
      tc.m_skip = true;
      tc.m_description = need.skip_text();
    }
  }
  void fill(doctest::detail::TestSuite&) const {}
};

/// First line of a case decorated with needs(need): where it runs though the need is not met
/// (required, or --no-skip), it fails here with the reason.
inline void require(const Need& need) {
  REQUIRE_MESSAGE(need.met(), need.missing() << " (" << std::string(need.env())
                                             << " asks for it, or --no-skip ran the case)");
}

/// A usable CUDA device 0, as coload itself decides it (cuda_unavailable_reason()).
inline const Need& cuda() {
  static const Need need = [] {
    try {
      const std::string why = coload::cuda_unavailable_reason();
      return Need("COLOAD_REQUIRE_CUDA", why.empty() ? why : "no usable CUDA device: " + why);
    } catch (const std::exception& e) {
      return Need("COLOAD_REQUIRE_CUDA", std::string("no usable CUDA device: ") + e.what());
    }
  }();
  return need;
}

/// Prints each case skipped for a need, with the reason, after doctest's own output. (The
/// summary line counts them; this says which and why.)
class SkipReasons : public doctest::IReporter {
 public:
  explicit SkipReasons(const doctest::ContextOptions& options) : out_(*options.cout) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData& tc) override {
    // Cases a command-line filter left out are reported here too; only a need's skip has this
    // description.
    if (tc.m_description && std::string_view(tc.m_description).starts_with("skipped: ")) {
      out_ << "[doctest] " << tc.m_file.c_str() << ":" << tc.m_line << ": \"" << tc.m_name
           << "\" " << tc.m_description << "\n";
    }
  }

 private:
  std::ostream& out_;
};

// Registered from every file that includes this; doctest keeps one listener per name.
DOCTEST_REGISTER_LISTENER("coload-skip-reasons", 1, SkipReasons);

}  // namespace coload::testing
