// Writes runtime/tests/data/topk_libstdcxx.txt: for 1000 generated cases, the indices that
// PyTorch's CPU topk (largest, sorted) returns, computed here with the real libstdc++
// algorithms called the way aten/src/ATen/native/TopKImpl.h calls them. The cases come from
// the same SplitMix64 sequence as the Rust test (runtime/src/sampler/topk.rs) and
// check_torch.py. Build and run: tools/topk/make_fixture.sh
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <utility>
#include <vector>

struct SplitMix {
  uint64_t state;
  uint64_t next() {
    state += 0x9e3779b97f4a7c15ULL;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return next() % n; }
};

// PyTorch's selection for one row: value/index pairs, a comparator on the value only
// (NaN first), partial_sort when k * 64 <= n, else nth_element then sort of the first k - 1.
template <typename T>
std::vector<int64_t> torch_topk(const std::vector<T>& values, int64_t k) {
  using Entry = std::pair<T, int64_t>;
  auto first = [](const Entry& x, const Entry& y) {
    return (std::isnan(x.first) && !std::isnan(y.first)) || x.first > y.first;
  };
  const int64_t n = values.size();
  std::vector<Entry> queue(n);
  for (int64_t j = 0; j < n; ++j) queue[j] = Entry(values[j], j);
  if (k * 64 <= n) {
    std::partial_sort(queue.begin(), queue.begin() + k, queue.end(), first);
  } else {
    std::nth_element(queue.begin(), queue.begin() + k - 1, queue.end(), first);
    std::sort(queue.begin(), queue.begin() + k - 1, first);
  }
  std::vector<int64_t> out;
  for (int64_t j = 0; j < k; ++j) out.push_back(queue[j].second);
  return out;
}

int main() {
  const double pool[8] = {1.0, 1.0 - 1.0 / double(1ULL << 40), 0.5, 0.25, 0.0, -0.0,
                          -std::numeric_limits<double>::infinity(),
                          std::numeric_limits<double>::quiet_NaN()};
  SplitMix rng{2026};
  std::printf("# torch.topk (CPU, largest, sorted) order from libstdc++ (tools/topk/reference.cpp)\n");
  for (int c = 0; c < 1000; ++c) {
    const int64_t n = 1 + rng.below(300);
    int64_t k;
    if (rng.below(2) == 0 && n >= 64) {
      k = 1 + rng.below(n / 64);
    } else {
      k = 1 + rng.below(n);
    }
    const uint64_t distinct = 2 + rng.below(6);
    std::vector<double> values(n);
    for (auto& v : values) {
      const uint64_t r = rng.below(1000);
      v = r == 0 ? pool[7] : pool[r % distinct];
    }
    std::vector<float> as_float(values.begin(), values.end());
    for (int pass = 0; pass < 2; ++pass) {
      auto idx = pass == 0 ? torch_topk(as_float, k) : torch_topk(values, k);
      std::printf(pass == 0 ? "f32:" : "f64:");
      for (auto i : idx) std::printf(" %lld", (long long)i);
      std::printf("\n");
    }
  }
}
