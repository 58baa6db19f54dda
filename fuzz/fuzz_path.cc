// Paths from requests and token claims: whatever SplitRelPath accepts must be relative, free of
// NUL bytes and "..", and made of names within NAME_MAX.
#include <limits.h>

#include <cstdlib>
#include <string>

#include "common/path.h"
#include "volume/ids.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string s(reinterpret_cast<const char*>(data), size);
  auto parts = sluice::SplitRelPath(s);
  if (parts.ok()) {
    for (const auto& p : *parts) {
      if (p.empty() || p == "." || p == ".." || p.size() > NAME_MAX) std::abort();
      if (p.find('/') != std::string::npos || p.find('\0') != std::string::npos) std::abort();
    }
    if (!s.empty() && s[0] == '/') std::abort();
  }
  if (sluice::ValidateName(s).ok() && (s == ".." || s.find('/') != std::string::npos)) std::abort();
  auto vf = sluice::VFolderId::Parse(s);
  if (vf.ok() && vf->hex.size() != 32) std::abort();
  return 0;
}
