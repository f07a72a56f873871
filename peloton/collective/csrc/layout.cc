#include "algorithms.h"

namespace peloton {

Segments even_segments(size_t count, int n, size_t esz) {
  const size_t parts = static_cast<size_t>(n);
  Segments s{std::vector<size_t>(parts), std::vector<size_t>(parts)};
  size_t at = 0;
  for (size_t j = 0; j < parts; ++j) {
    const size_t c = count / parts + (j < count % parts ? 1 : 0);
    s.off[j] = at * esz;
    s.len[j] = c * esz;
    at += c;
  }
  return s;
}

Segments allgather_segments(const std::vector<int64_t>& dim0s, size_t row_bytes) {
  Segments s{std::vector<size_t>(dim0s.size()), std::vector<size_t>(dim0s.size())};
  size_t total = 0;
  for (size_t j = 0; j < dim0s.size(); ++j) {
    s.off[j] = total;
    s.len[j] = static_cast<size_t>(dim0s[j]) * row_bytes;
    total += s.len[j];
  }
  return s;
}

Segments reduce_scatter_segments(int64_t rows, size_t row_bytes, int n) {
  Segments s{std::vector<size_t>(static_cast<size_t>(n)), std::vector<size_t>(static_cast<size_t>(n))};
  size_t at = 0;
  for (int j = 0; j < n; ++j) {
    const int64_t mine = rows / n + (j < rows % n ? 1 : 0);
    s.off[static_cast<size_t>(j)] = at;
    s.len[static_cast<size_t>(j)] = static_cast<size_t>(mine) * row_bytes;
    at += s.len[static_cast<size_t>(j)];
  }
  return s;
}

size_t row_bytes(const std::vector<int64_t>& shape, DType dt) {
  size_t row = dtype_size(dt);
  for (size_t i = 1; i < shape.size(); ++i) row *= static_cast<size_t>(shape[i]);
  return row;
}

}  // namespace peloton
