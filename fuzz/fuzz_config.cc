// Configuration text: any input is a parsed config or an error, never a crash.
#include <string_view>

#include "common/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view s(reinterpret_cast<const char*>(data), size);
  (void)sluice::ParseConfig(s, "fuzz");
  (void)sluice::ParseBinarySize(s);
  (void)sluice::ParseDuration(s);
  return 0;
}
