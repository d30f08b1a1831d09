// Decode attention that reads a block KV cache in place (week 09): one query token per sequence,
// each against its own sequence's keys, found through its block table, with no gather copy.
//
// The eager path (infer.paged_attention.PagedKV._decode_attention) first copies every sequence's
// blocks into one [batch, kv_heads, longest, head_dim] tensor, then calls scaled_dot_product_attention
// with a mask for the shorter sequences. Here each key and value is read once, where it lies, and
// used by every query head that shares its KV head (grouped-query attention), so the bytes moved
// are the cache's own, once.
//
// Layout (week 02's KVCache seen as blocks, as in infer/paged_attention.py):
//   q            [batch, heads, head_dim]                      float32, contiguous
//   k_cache      [num_blocks, kv_heads, block_size, head_dim]  float32, contiguous (v_cache alike)
//   block_tables [batch, max_blocks] int64: position p of sequence b lives in block
//                block_tables[b][p / block_size], at offset p % block_size
//   lengths      [batch] int64: sequence b attends to positions 0 .. lengths[b] - 1
// The slot store is the case block_size = max_model_len, one block per sequence.
//
// Per sequence and KV head: scores of the group's queries against every key, a softmax (its
// maximum subtracted first, so exp never overflows), then the weighted sum of the values. Checked
// against the eager path in tests/test_cpu_kernels.py, as llm.c checks each fast kernel against a
// simple one.

#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <vector>

torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor block_tables, torch::Tensor lengths, double scale) {
  TORCH_CHECK(q.dtype() == torch::kFloat32 && k_cache.dtype() == torch::kFloat32 &&
                  v_cache.dtype() == torch::kFloat32,
              "paged_decode_attention takes float32 queries and caches");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  block_tables.is_contiguous() && lengths.is_contiguous(),
              "paged_decode_attention takes contiguous tensors");
  const int64_t batch = q.size(0), heads = q.size(1), head_dim = q.size(2);
  const int64_t kv_heads = k_cache.size(1), block_size = k_cache.size(2);
  const int64_t group = heads / kv_heads, max_blocks = block_tables.size(1);
  TORCH_CHECK(heads % kv_heads == 0 && k_cache.size(3) == head_dim, "query and cache shapes do not fit");

  auto out = torch::empty_like(q);
  const float* queries = q.data_ptr<float>();
  const float* keys = k_cache.data_ptr<float>();
  const float* values = v_cache.data_ptr<float>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = lengths.data_ptr<int64_t>();
  float* result = out.data_ptr<float>();
  const float scale_f = static_cast<float>(scale);

  std::vector<float> scores;                     // [group, length]: one row per query head of the group
  std::vector<float> weighted(group * head_dim);  // [group, head_dim]: the sums of weighted values
  std::vector<float> totals(group);               // each row's softmax denominator

  // where position `pos` of sequence `b` keeps KV head `kv_head` (an offset into k_cache or v_cache)
  auto at = [&](int64_t b, int64_t pos, int64_t kv_head) {
    const int64_t block = tables[b * max_blocks + pos / block_size];
    return ((block * kv_heads + kv_head) * block_size + pos % block_size) * head_dim;
  };

  for (int64_t b = 0; b < batch; ++b) {
    const int64_t length = lens[b];
    TORCH_CHECK(length > 0 && length <= max_blocks * block_size, "sequence ", b, ": length ", length,
                " does not fit its block table");
    scores.resize(group * length);
    for (int64_t kv_head = 0; kv_head < kv_heads; ++kv_head) {
      const float* group_queries = queries + (b * heads + kv_head * group) * head_dim;
      for (int64_t pos = 0; pos < length; ++pos) {
        const float* key = keys + at(b, pos, kv_head);
        for (int64_t g = 0; g < group; ++g) {
          const float* query = group_queries + g * head_dim;
          float dot = 0.f;
#pragma omp simd reduction(+ : dot)
          for (int64_t i = 0; i < head_dim; ++i) dot += query[i] * key[i];
          scores[g * length + pos] = dot * scale_f;
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        float* row = scores.data() + g * length;
        const float top = *std::max_element(row, row + length);
        float total = 0.f;
        for (int64_t pos = 0; pos < length; ++pos) {
          row[pos] = std::exp(row[pos] - top);
          total += row[pos];
        }
        totals[g] = total;
      }
      std::fill(weighted.begin(), weighted.end(), 0.f);
      for (int64_t pos = 0; pos < length; ++pos) {
        const float* value = values + at(b, pos, kv_head);
        for (int64_t g = 0; g < group; ++g) {
          const float weight = scores[g * length + pos];
          float* sum = weighted.data() + g * head_dim;
#pragma omp simd
          for (int64_t i = 0; i < head_dim; ++i) sum[i] += weight * value[i];
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        float* row_out = result + (b * heads + kv_head * group + g) * head_dim;
        for (int64_t i = 0; i < head_dim; ++i) row_out[i] = weighted[g * head_dim + i] / totals[g];
      }
    }
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("paged_decode_attention", &paged_decode_attention,
             "decode attention over a block KV cache, read in place (float32, CPU)");
}
