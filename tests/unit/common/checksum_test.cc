#include "common/checksum.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "common/crypto.h"

namespace sluice {
namespace {

// The "check" values of the CRC catalogue (the CRC of "123456789").
TEST(Checksum, CheckValues) {
  const std::string s = "123456789";
  EXPECT_EQ(Crc32(s.data(), s.size()), 0xCBF43926u);
  EXPECT_EQ(Crc32c(s.data(), s.size()), 0xE3069283u);
  EXPECT_EQ(Crc64Nvme(s.data(), s.size()), 0xAE8B14860A799888ull);
}

TEST(Checksum, IncrementalEqualsWhole) {
  std::mt19937 rng(7);
  std::string data(100003, '\0');
  for (auto& c : data) c = static_cast<char>(rng());
  for (auto a : {ChecksumAlgo::kCrc32, ChecksumAlgo::kCrc32c, ChecksumAlgo::kCrc64Nvme,
                 ChecksumAlgo::kSha1, ChecksumAlgo::kSha256}) {
    Checksummer whole(a), pieces(a);
    whole.Update(data.data(), data.size());
    for (size_t i = 0; i < data.size(); i += 997)
      pieces.Update(data.data() + i, std::min<size_t>(997, data.size() - i));
    std::string w = whole.Final();
    EXPECT_EQ(w, pieces.Final()) << ChecksumName(a);
    EXPECT_EQ(w.size(), ChecksumSize(a));
  }
  Checksummer sha(ChecksumAlgo::kSha256);
  sha.Update(data.data(), data.size());
  EXPECT_EQ(sha.Final(), Sha256(data));
}

TEST(Checksum, CombineWithoutData) {
  std::mt19937 rng(11);
  std::string a(70000, '\0'), b(12345, '\0');
  for (auto& c : a) c = static_cast<char>(rng());
  for (auto& c : b) c = static_cast<char>(rng());
  std::string ab = a + b;
  for (auto algo : {ChecksumAlgo::kCrc32, ChecksumAlgo::kCrc32c, ChecksumAlgo::kCrc64Nvme}) {
    Checksummer ca(algo), cb(algo), cab(algo);
    ca.Update(a.data(), a.size());
    cb.Update(b.data(), b.size());
    cab.Update(ab.data(), ab.size());
    EXPECT_EQ(CrcCombine(algo, ca.crc(), cb.crc(), b.size()), cab.crc()) << ChecksumName(algo);
    EXPECT_EQ(CrcCombine(algo, ca.crc(), 0, 0), ca.crc());
  }
}

TEST(Checksum, Names) {
  EXPECT_EQ(ChecksumAlgoFromName("crc64nvme"), ChecksumAlgo::kCrc64Nvme);
  EXPECT_EQ(ChecksumAlgoFromName("SHA256"), ChecksumAlgo::kSha256);
  EXPECT_FALSE(ChecksumAlgoFromName("md5"));
  EXPECT_EQ(ChecksumHeader(ChecksumAlgo::kCrc32c), "x-amz-checksum-crc32c");
  EXPECT_EQ(Base64Encode(CrcBytes(ChecksumAlgo::kCrc32, 0xCBF43926u)), "y/Q5Jg==");
}

}  // namespace
}  // namespace sluice
