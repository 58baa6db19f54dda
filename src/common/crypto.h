// Hashing, MACs and sealing on OpenSSL 3: what tokens, SigV4 and object ETags need.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace sluice {

// HMAC-SHA256 of `data` under `key`, raw (32 bytes). One keyed context per thread.
std::string HmacSha256(std::string_view key, std::string_view data);
// SHA-256 of `data`, raw (32 bytes).
std::string Sha256(std::string_view data);
// Lower-case hex of raw bytes.
std::string HexEncode(std::string_view raw);
// The same three into the caller's buffers, without allocating (SigV4 on every request).
void HmacSha256To(std::string_view key, std::string_view data, unsigned char out[32]);
void Sha256To(std::string_view data, unsigned char out[32]);
// out[0, 2n) = lower-case hex of raw[0, n).
void HexEncodeTo(const unsigned char* raw, size_t n, char* out);
// Raw bytes of hex (either case); kInvalidArgument when it is not hex of even length.
Result<std::string> HexDecode(std::string_view hex);
// Standard base64 with padding (Content-MD5, x-amz-checksum-*).
std::string Base64Encode(std::string_view raw);
Result<std::string> Base64Decode(std::string_view b64);

// An incremental digest (MD5, SHA-1, SHA-256) for data that streams through.
class Digest {
 public:
  enum class Algo { kMd5, kSha1, kSha256 };
  explicit Digest(Algo algo);
  ~Digest();
  Digest(Digest&&) noexcept;
  Digest& operator=(Digest&&) noexcept;
  void Update(std::string_view data);
  void Update(const char* data, size_t n) { Update(std::string_view(data, n)); }
  // The raw digest; the object starts over afterwards.
  std::string Final();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// S3's multipart ETag of parts with these raw MD5s: the hex MD5 of them, "-", their count;
// unquoted.
std::string MultipartETag(const std::vector<std::string>& raw_md5s);

// AES-256-GCM with a 32-byte key: seals `plain` as nonce | ciphertext | tag, authenticated
// together with `aad` (what the secret belongs to, so a sealed value cannot be moved to
// another record). Open answers kUnauthenticated when the key or the data is wrong.
Result<std::string> Seal(std::string_view key, std::string_view plain, std::string_view aad);
Result<std::string> Unseal(std::string_view key, std::string_view sealed, std::string_view aad);

}  // namespace sluice
