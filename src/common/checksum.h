// The checksums S3 clients send and ask for (x-amz-checksum-*): CRC32 (zlib), CRC32C (ISA-L),
// CRC64NVME (table-driven here: Debian 12's ISA-L 2.30 predates its crc64_rocksoft), SHA-1 and
// SHA-256 (OpenSSL), computed incrementally, and the combination of two CRCs without the data
// (for full-object checksums of multipart uploads).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace sluice {

enum class ChecksumAlgo { kCrc32, kCrc32c, kCrc64Nvme, kSha1, kSha256 };
inline constexpr ChecksumAlgo kAllChecksums[] = {ChecksumAlgo::kCrc32, ChecksumAlgo::kCrc32c,
                                                 ChecksumAlgo::kCrc64Nvme, ChecksumAlgo::kSha1,
                                                 ChecksumAlgo::kSha256};

// "CRC32", "crc32c", "CRC64NVME", "SHA1", "sha256" (any case); nullopt otherwise.
std::optional<ChecksumAlgo> ChecksumAlgoFromName(std::string_view name);
// "CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256".
std::string_view ChecksumName(ChecksumAlgo a);
// How checksums are keyed where they are stored (ObjectMeta): "crc32", "crc64nvme", "sha256"...
std::string ChecksumKey(ChecksumAlgo a);
// "x-amz-checksum-crc32", ...
std::string_view ChecksumHeader(ChecksumAlgo a);
// Raw digest size in bytes: 4, 4, 8, 20, 32.
size_t ChecksumSize(ChecksumAlgo a);
bool IsCrc(ChecksumAlgo a);

uint32_t Crc32(const void* data, size_t n, uint32_t crc = 0);
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);
uint64_t Crc64Nvme(const void* data, size_t n, uint64_t crc = 0);
// The CRC of A followed by B, from crc(A), crc(B) and B's length.
uint64_t CrcCombine(ChecksumAlgo a, uint64_t crc_a, uint64_t crc_b, uint64_t len_b);
// A CRC value as S3 transmits it (big-endian bytes), and back.
std::string CrcBytes(ChecksumAlgo a, uint64_t crc);
uint64_t CrcFromBytes(std::string_view raw);

class Checksummer {
 public:
  explicit Checksummer(ChecksumAlgo a);
  ~Checksummer();
  Checksummer(Checksummer&&) noexcept;
  Checksummer& operator=(Checksummer&&) noexcept;
  ChecksumAlgo algo() const { return algo_; }
  void Update(const char* data, size_t n);
  // Raw digest (big-endian for CRCs). Once.
  std::string Final();
  uint64_t crc() const { return crc_; }

 private:
  ChecksumAlgo algo_;
  uint64_t crc_ = 0;
  struct Md;
  std::unique_ptr<Md> md_;
};

}  // namespace sluice
