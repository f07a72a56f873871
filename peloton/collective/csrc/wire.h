// Little serialiser for control messages (both ends are this same build). Pure: no I/O.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace peloton {

class Writer {
 public:
  void u8(uint8_t v) { raw(&v, 1); }
  void u32(uint32_t v) { raw(&v, 4); }
  void i64(int64_t v) { raw(&v, 8); }
  void str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    raw(s.data(), s.size());
  }
  void raw(const void* p, size_t n) {
    const auto* c = static_cast<const char*>(p);
    buf_.insert(buf_.end(), c, c + n);
  }
  const std::vector<char>& bytes() const { return buf_; }

 private:
  std::vector<char> buf_;
};

class Reader {
 public:
  explicit Reader(const std::vector<char>& b) : buf_(b) {}
  uint8_t u8() { uint8_t v; raw(&v, 1); return v; }
  uint32_t u32() { uint32_t v; raw(&v, 4); return v; }
  int64_t i64() { int64_t v; raw(&v, 8); return v; }
  std::string str() {
    const uint32_t n = u32();
    std::string s(n, '\0');
    raw(s.data(), n);
    return s;
  }
  void raw(void* p, size_t n);

 private:
  const std::vector<char>& buf_;
  size_t pos_ = 0;
};

}  // namespace peloton
