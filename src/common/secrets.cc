#include "common/secrets.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "common/crypto.h"

namespace sluice {

std::string RandomHexString(size_t n) {
  std::string bytes(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(bytes.data()), static_cast<int>(n)) != 1)
    throw std::runtime_error("RAND_bytes failed");
  std::string out;
  for (unsigned char c : bytes) out += fmt::format("{:02x}", c);
  return out;
}

Result<std::string> LoadOrCreateSecret(const std::string& path, bool* created) {
  if (created) *created = false;
  std::ifstream in(path);
  if (in) {
    std::stringstream ss;
    ss << in.rdbuf();
    std::string s = ss.str();
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
    if (s.empty())
      return Status(Code::kInvalidArgument, fmt::format("secret file '{}' is empty", path));
    return s;
  }
  std::string dir = path.substr(0, path.rfind('/'));
  if (!dir.empty() && ::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    return Status::FromErrno(errno, fmt::format("create '{}'", dir));
  std::string secret = RandomHexString(32);
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Status::FromErrno(errno, fmt::format("create '{}'", tmp));
  ::fchmod(fd, 0600);
  std::string body = secret + "\n";
  bool ok = ::write(fd, body.data(), body.size()) == static_cast<ssize_t>(body.size()) &&
            ::fsync(fd) == 0;
  int err = errno;
  ::close(fd);
  if (!ok) return Status::FromErrno(err, fmt::format("write '{}'", tmp));
  // link() fails if another process created the secret meanwhile: then use theirs.
  if (::link(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    if (e == EEXIST) return LoadOrCreateSecret(path, created);
    return Status::FromErrno(e, fmt::format("create '{}'", path));
  }
  ::unlink(tmp.c_str());
  if (created) *created = true;
  return secret;
}

bool ConstantTimeEqualsFixed(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  unsigned char ha[SHA256_DIGEST_LENGTH], hb[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(a.data()), a.size(), ha);
  SHA256(reinterpret_cast<const unsigned char*>(b.data()), b.size(), hb);
  return CRYPTO_memcmp(ha, hb, sizeof(ha)) == 0 && a.size() == b.size();
}

std::string UniqueHexId() {
  // splitmix64 over a per-thread counter that starts at a random point: distinct for 2^64
  // calls on a thread, and threads start 2^64-wide apart at random, so ids do not repeat in
  // practice; nothing about them is secret (RAND_bytes costs a lock and a getpid each call).
  thread_local uint64_t state = [] {
    uint64_t seed = 0;
    if (RAND_bytes(reinterpret_cast<unsigned char*>(&seed), sizeof seed) != 1)
      throw std::runtime_error("RAND_bytes failed");
    return seed;
  }();
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  unsigned char raw[8];
  for (int i = 7; i >= 0; --i, z >>= 8) raw[i] = static_cast<unsigned char>(z);
  std::string out(16, '0');
  HexEncodeTo(raw, sizeof raw, out.data());
  return out;
}

}  // namespace sluice
