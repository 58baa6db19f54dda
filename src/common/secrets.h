// Secrets: generated once, stored with mode 0600, compared in constant time.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace sluice {

// Reads the secret stored at `path`, or creates it (32 random bytes, hex) with mode 0600.
// `created` tells which happened.
Result<std::string> LoadOrCreateSecret(const std::string& path, bool* created = nullptr);

// Compares in time independent of where the inputs differ (and of their lengths).
bool ConstantTimeEquals(std::string_view a, std::string_view b);
// The same for values whose length is public (a 64-digit signature): the lengths are compared
// first, the bytes in constant time, without ConstantTimeEquals's two hashes.
bool ConstantTimeEqualsFixed(std::string_view a, std::string_view b);

// `n` cryptographically random bytes as lower-case hex.
std::string RandomHexString(size_t n);

// 16 hex digits that differ from call to call (request ids): cheap, not secret.
std::string UniqueHexId();

}  // namespace sluice
