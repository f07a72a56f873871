#include "wire.h"

#include <cstring>

#include "common.h"

namespace peloton {

void Reader::raw(void* p, size_t n) {
  if (pos_ + n > buf_.size()) throw CollectiveError("malformed control message");
  std::memcpy(p, buf_.data() + pos_, n);
  pos_ += n;
}

}  // namespace peloton
