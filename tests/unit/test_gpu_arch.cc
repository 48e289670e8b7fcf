// The GPU architectures of a build (src/cuda/gpu_arch.h): which GPUs kernels
// built as machine code for sm_XY run on, and what init says to the user of a
// GPU outside the build (the CUDA backend's checkArch; on a GPU,
// tests/gpu/gpu_arch_test.cc checks that init says it).
#include <string>
#include <vector>

#include "common.h"

#include "cuda/gpu_arch.h"

namespace {

using ep::cuda::anyArchRunsOn;
using ep::cuda::archRefusal;
using ep::cuda::archRunsOn;
using ep::cuda::archsWith;
using ep::cuda::parseArchs;

void the_build_list_is_parsed(void**) {
  assert_true(parseArchs("90") == std::vector<int>({90}));
  assert_true(parseArchs("80 90") == std::vector<int>({80, 90}));
  assert_true(parseArchs("  80   90 ") == std::vector<int>({80, 90}));
  assert_true(parseArchs("80;90,100") == std::vector<int>({80, 90, 100}));
  assert_true(parseArchs("").empty());
  assert_true(parseArchs(nullptr).empty());
  assert_true(parseArchs("x 7 90").size() == 1);  // not an architecture: skipped
}

void machine_code_runs_on_its_major_at_the_same_or_a_later_minor(void**) {
  assert_true(archRunsOn(90, 9, 0));
  assert_true(archRunsOn(80, 8, 0));
  assert_true(archRunsOn(80, 8, 6));  // A100 code on an A10 / RTX 30
  assert_true(archRunsOn(80, 8, 9));  // and on Ada
  assert_false(archRunsOn(86, 8, 0));
  assert_false(archRunsOn(80, 9, 0));  // no PTX in the build: not forward
  assert_false(archRunsOn(90, 8, 0));
  assert_false(archRunsOn(90, 10, 0));
  assert_true(anyArchRunsOn({80, 90}, 9, 0));
  assert_true(anyArchRunsOn({80, 90}, 8, 6));
  assert_false(anyArchRunsOn({90}, 8, 0));
  assert_false(anyArchRunsOn({}, 9, 0));
}

void the_advice_adds_the_gpu_to_the_build(void**) {
  assert_string_equal(archsWith({90}, 8, 0).c_str(), "80 90");
  assert_string_equal(archsWith({90}, 8, 6).c_str(), "86 90");
  assert_string_equal(archsWith({80, 90}, 10, 0).c_str(), "80 90 100");
  assert_string_equal(archsWith({80}, 9, 0).c_str(), "80 90");
  assert_string_equal(archsWith({}, 9, 0).c_str(), "90");
}

void the_refusal_names_build_gpu_and_fix(void**) {
  const std::string m = archRefusal({90}, 1, "NVIDIA A100-SXM4-80GB", 8, 0);
  assert_non_null(strstr(m.c_str(), "built for sm_90"));
  assert_non_null(strstr(m.c_str(), "GPU 1 (NVIDIA A100-SXM4-80GB)"));
  assert_non_null(strstr(m.c_str(), "compute capability 8.0 (sm_80)"));
  assert_non_null(strstr(m.c_str(), "make CUDA_ARCHS=\"80 90\""));
  const std::string n = archRefusal({80, 90}, 0, "B200", 10, 0);
  assert_non_null(strstr(n.c_str(), "built for sm_80, sm_90"));
  assert_non_null(strstr(n.c_str(), "CUDA_ARCHS=\"80 90 100\""));
}

}  // namespace

int main() {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(the_build_list_is_parsed),
      cmocka_unit_test(machine_code_runs_on_its_major_at_the_same_or_a_later_minor),
      cmocka_unit_test(the_advice_adds_the_gpu_to_the_build),
      cmocka_unit_test(the_refusal_names_build_gpu_and_fix),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
