#include "common/checksum.h"

#include <isa-l/crc.h>
#include <openssl/evp.h>
#include <zlib.h>

#include <array>
#include <cctype>

namespace sluice {

namespace {

constexpr uint64_t kCrc64NvmePolyRefl = 0x9a6c9329ac4bc9b5ULL;

// Slice-by-8 tables for the reflected CRC-64/NVME.
struct Crc64Tables {
  std::array<std::array<uint64_t, 256>, 8> t{};
  Crc64Tables() {
    for (uint64_t i = 0; i < 256; ++i) {
      uint64_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? (c >> 1) ^ kCrc64NvmePolyRefl : c >> 1;
      t[0][i] = c;
    }
    for (int s = 1; s < 8; ++s)
      for (int i = 0; i < 256; ++i) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
};

const Crc64Tables& Tables() {
  static const Crc64Tables tables;
  return tables;
}

// GF(2) matrix helpers of zlib's crc32_combine, for any reflected CRC up to 64 bits.
uint64_t Gf2Times(const uint64_t* mat, uint64_t vec) {
  uint64_t sum = 0;
  for (int i = 0; vec; ++i, vec >>= 1)
    if (vec & 1) sum ^= mat[i];
  return sum;
}

void Gf2Square(uint64_t* square, const uint64_t* mat, int width) {
  for (int n = 0; n < width; ++n) square[n] = Gf2Times(mat, mat[n]);
}

uint64_t CombineGeneric(uint64_t crc1, uint64_t crc2, uint64_t len2, uint64_t poly, int width) {
  if (len2 == 0) return crc1;
  uint64_t even[64], odd[64];
  odd[0] = poly;  // the operator for one zero bit
  uint64_t row = 1;
  for (int n = 1; n < width; ++n) {
    odd[n] = row;
    row <<= 1;
  }
  Gf2Square(even, odd, width);  // two zero bits
  Gf2Square(odd, even, width);  // four zero bits
  do {
    Gf2Square(even, odd, width);
    if (len2 & 1) crc1 = Gf2Times(even, crc1);
    len2 >>= 1;
    if (!len2) break;
    Gf2Square(odd, even, width);
    if (len2 & 1) crc1 = Gf2Times(odd, crc1);
    len2 >>= 1;
  } while (len2);
  return crc1 ^ crc2;
}

}  // namespace

std::optional<ChecksumAlgo> ChecksumAlgoFromName(std::string_view name) {
  std::string n(name);
  for (auto& c : n) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (n == "CRC32") return ChecksumAlgo::kCrc32;
  if (n == "CRC32C") return ChecksumAlgo::kCrc32c;
  if (n == "CRC64NVME") return ChecksumAlgo::kCrc64Nvme;
  if (n == "SHA1") return ChecksumAlgo::kSha1;
  if (n == "SHA256") return ChecksumAlgo::kSha256;
  return std::nullopt;
}

std::string ChecksumKey(ChecksumAlgo a) {
  std::string n(ChecksumName(a));
  for (char& c : n) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return n;
}

std::string_view ChecksumName(ChecksumAlgo a) {
  switch (a) {
    case ChecksumAlgo::kCrc32:
      return "CRC32";
    case ChecksumAlgo::kCrc32c:
      return "CRC32C";
    case ChecksumAlgo::kCrc64Nvme:
      return "CRC64NVME";
    case ChecksumAlgo::kSha1:
      return "SHA1";
    case ChecksumAlgo::kSha256:
      return "SHA256";
  }
  return "";
}

std::string_view ChecksumHeader(ChecksumAlgo a) {
  switch (a) {
    case ChecksumAlgo::kCrc32:
      return "x-amz-checksum-crc32";
    case ChecksumAlgo::kCrc32c:
      return "x-amz-checksum-crc32c";
    case ChecksumAlgo::kCrc64Nvme:
      return "x-amz-checksum-crc64nvme";
    case ChecksumAlgo::kSha1:
      return "x-amz-checksum-sha1";
    case ChecksumAlgo::kSha256:
      return "x-amz-checksum-sha256";
  }
  return "";
}

size_t ChecksumSize(ChecksumAlgo a) {
  switch (a) {
    case ChecksumAlgo::kCrc32:
    case ChecksumAlgo::kCrc32c:
      return 4;
    case ChecksumAlgo::kCrc64Nvme:
      return 8;
    case ChecksumAlgo::kSha1:
      return 20;
    case ChecksumAlgo::kSha256:
      return 32;
  }
  return 0;
}

bool IsCrc(ChecksumAlgo a) {
  return a == ChecksumAlgo::kCrc32 || a == ChecksumAlgo::kCrc32c || a == ChecksumAlgo::kCrc64Nvme;
}

uint32_t Crc32(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    uInt step = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    crc = static_cast<uint32_t>(::crc32(crc, p, step));
    p += step;
    n -= step;
  }
  return crc;
}

uint32_t Crc32c(const void* data, size_t n, uint32_t crc) {
  // ISA-L's crc32_iscsi takes and returns the register without the final inversion.
  return ~crc32_iscsi(static_cast<unsigned char*>(const_cast<void*>(data)), static_cast<int>(n),
                      ~crc);
}

uint64_t Crc64Nvme(const void* data, size_t n, uint64_t crc) {
  const auto& t = Tables().t;
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  while (n >= 8) {
    uint64_t v = crc ^ (uint64_t(p[0]) | uint64_t(p[1]) << 8 | uint64_t(p[2]) << 16 |
                        uint64_t(p[3]) << 24 | uint64_t(p[4]) << 32 | uint64_t(p[5]) << 40 |
                        uint64_t(p[6]) << 48 | uint64_t(p[7]) << 56);
    crc = t[7][v & 0xff] ^ t[6][(v >> 8) & 0xff] ^ t[5][(v >> 16) & 0xff] ^ t[4][(v >> 24) & 0xff] ^
          t[3][(v >> 32) & 0xff] ^ t[2][(v >> 40) & 0xff] ^ t[1][(v >> 48) & 0xff] ^ t[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) crc = t[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint64_t CrcCombine(ChecksumAlgo a, uint64_t crc_a, uint64_t crc_b, uint64_t len_b) {
  switch (a) {
    case ChecksumAlgo::kCrc32:
      return static_cast<uint32_t>(::crc32_combine(
          static_cast<uLong>(crc_a), static_cast<uLong>(crc_b), static_cast<z_off_t>(len_b)));
    case ChecksumAlgo::kCrc32c:
      return CombineGeneric(crc_a, crc_b, len_b, 0x82f63b78u, 32);
    case ChecksumAlgo::kCrc64Nvme:
      return CombineGeneric(crc_a, crc_b, len_b, kCrc64NvmePolyRefl, 64);
    default:
      return 0;
  }
}

std::string CrcBytes(ChecksumAlgo a, uint64_t crc) {
  size_t n = ChecksumSize(a);
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>(crc >> (8 * (n - 1 - i)));
  return out;
}

uint64_t CrcFromBytes(std::string_view raw) {
  uint64_t v = 0;
  for (unsigned char c : raw) v = v << 8 | c;
  return v;
}

struct Checksummer::Md {
  EVP_MD_CTX* ctx = nullptr;
  ~Md() { EVP_MD_CTX_free(ctx); }
};

Checksummer::Checksummer(ChecksumAlgo a) : algo_(a) {
  if (!IsCrc(a)) {
    md_ = std::make_unique<Md>();
    md_->ctx = EVP_MD_CTX_new();
    EVP_DigestInit_ex(md_->ctx, a == ChecksumAlgo::kSha1 ? EVP_sha1() : EVP_sha256(), nullptr);
  }
}
Checksummer::~Checksummer() = default;
Checksummer::Checksummer(Checksummer&&) noexcept = default;
Checksummer& Checksummer::operator=(Checksummer&&) noexcept = default;

void Checksummer::Update(const char* data, size_t n) {
  switch (algo_) {
    case ChecksumAlgo::kCrc32:
      crc_ = Crc32(data, n, static_cast<uint32_t>(crc_));
      break;
    case ChecksumAlgo::kCrc32c:
      crc_ = Crc32c(data, n, static_cast<uint32_t>(crc_));
      break;
    case ChecksumAlgo::kCrc64Nvme:
      crc_ = Crc64Nvme(data, n, crc_);
      break;
    default:
      EVP_DigestUpdate(md_->ctx, data, n);
  }
}

std::string Checksummer::Final() {
  if (IsCrc(algo_)) return CrcBytes(algo_, crc_);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(md_->ctx, out, &len);
  return std::string(reinterpret_cast<char*>(out), len);
}

}  // namespace sluice
