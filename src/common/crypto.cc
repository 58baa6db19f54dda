#include "common/crypto.h"

#include <fmt/format.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <memory>
#include <stdexcept>

namespace sluice {

namespace {

// One keyed HMAC-SHA256 context per thread, re-initialised for each message: OpenSSL 3's
// one-shot HMAC() fetches the algorithms and sets the key up on every call, which costs about
// four times as much as the MAC of a short message itself (tokens and SigV4 on every request).
class HmacContext {
 public:
  HmacContext() : mac_(EVP_MAC_fetch(nullptr, "HMAC", nullptr)) {
    if (mac_) ctx_ = EVP_MAC_CTX_new(mac_);
  }
  ~HmacContext() {
    EVP_MAC_CTX_free(ctx_);
    EVP_MAC_free(mac_);
  }
  // False when OpenSSL failed; the caller then uses the one-shot HMAC().
  bool Mac(std::string_view key, std::string_view data, unsigned char* out, size_t* len) {
    if (!ctx_) return false;
    bool rekey = !keyed_ || key != key_;
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                           OSSL_PARAM_construct_end()};
    int ok = rekey ? EVP_MAC_init(ctx_, reinterpret_cast<const unsigned char*>(key.data()),
                                  key.size(), params)
                   : EVP_MAC_init(ctx_, nullptr, 0, nullptr);
    keyed_ = rekey ? ok == 1 : keyed_;
    if (rekey) key_ = key;
    return ok == 1 &&
           EVP_MAC_update(ctx_, reinterpret_cast<const unsigned char*>(data.data()), data.size()) ==
               1 &&
           EVP_MAC_final(ctx_, out, len, 32) == 1;
  }

 private:
  EVP_MAC* mac_ = nullptr;
  EVP_MAC_CTX* ctx_ = nullptr;
  bool keyed_ = false;
  std::string key_;
};

// Fetched once: with an implicit algorithm (EVP_sha256()) OpenSSL 3 looks the implementation up
// again, under a lock, at every init (SigV4 hashes every request).
const EVP_MD* MdOf(Digest::Algo a) {
  static EVP_MD* const md5 = EVP_MD_fetch(nullptr, "MD5", nullptr);
  static EVP_MD* const sha1 = EVP_MD_fetch(nullptr, "SHA1", nullptr);
  static EVP_MD* const sha256 = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  switch (a) {
    case Digest::Algo::kMd5:
      return md5 ? md5 : EVP_md5();
    case Digest::Algo::kSha1:
      return sha1 ? sha1 : EVP_sha1();
    case Digest::Algo::kSha256:
      return sha256 ? sha256 : EVP_sha256();
  }
  return EVP_sha256();
}

int HexVal(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

void HmacSha256To(std::string_view key, std::string_view data, unsigned char out[32]) {
  thread_local HmacContext ctx;
  size_t len = 0;
  if (ctx.Mac(key, data, out, &len) && len == 32) return;
  unsigned int ulen = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &ulen);
}

std::string HmacSha256(std::string_view key, std::string_view data) {
  unsigned char out[32];
  HmacSha256To(key, data, out);
  return std::string(reinterpret_cast<char*>(out), sizeof out);
}

void Sha256To(std::string_view data, unsigned char out[32]) {
  // Freed when the thread ends (the I/O pool's added threads come and go).
  thread_local std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> owned(EVP_MD_CTX_new(),
                                                                             &EVP_MD_CTX_free);
  EVP_MD_CTX* ctx = owned.get();
  unsigned int len = 0;
  if (!ctx || EVP_DigestInit_ex(ctx, MdOf(Digest::Algo::kSha256), nullptr) != 1 ||
      EVP_DigestUpdate(ctx, data.data(), data.size()) != 1 ||
      EVP_DigestFinal_ex(ctx, out, &len) != 1)
    EVP_Digest(data.data(), data.size(), out, &len, EVP_sha256(), nullptr);
}

std::string Sha256(std::string_view data) {
  unsigned char out[32];
  Sha256To(data, out);
  return std::string(reinterpret_cast<char*>(out), sizeof out);
}

void HexEncodeTo(const unsigned char* raw, size_t n, char* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kHex[raw[i] >> 4];
    out[2 * i + 1] = kHex[raw[i] & 15];
  }
}

std::string HexEncode(std::string_view raw) {
  std::string out(raw.size() * 2, '\0');
  HexEncodeTo(reinterpret_cast<const unsigned char*>(raw.data()), raw.size(), out.data());
  return out;
}

Result<std::string> HexDecode(std::string_view hex) {
  if (hex.size() % 2) return Status(Code::kInvalidArgument, "odd-length hex");
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = HexVal(hex[2 * i]), lo = HexVal(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return Status(Code::kInvalidArgument, "not hex");
    out[i] = static_cast<char>(hi << 4 | lo);
  }
  return out;
}

std::string Base64Encode(std::string_view raw) {
  std::string out(4 * ((raw.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(raw.data()),
                          static_cast<int>(raw.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

Result<std::string> Base64Decode(std::string_view b64) {
  if (b64.size() % 4 != 0) return Status(Code::kInvalidArgument, "bad base64 length");
  for (char c : b64)
    if (!(isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '/' || c == '='))
      return Status(Code::kInvalidArgument, "not base64");
  std::string out(b64.size() / 4 * 3, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(b64.data()),
                          static_cast<int>(b64.size()));
  if (n < 0) return Status(Code::kInvalidArgument, "not base64");
  size_t pad = 0;
  for (size_t i = b64.size(); i > 0 && b64[i - 1] == '='; --i) ++pad;
  if (pad > 2) return Status(Code::kInvalidArgument, "not base64");
  out.resize(static_cast<size_t>(n) - pad);
  return out;
}

struct Digest::Impl {
  EVP_MD_CTX* ctx = nullptr;
  const EVP_MD* md = nullptr;
  ~Impl() { EVP_MD_CTX_free(ctx); }
};

Digest::Digest(Algo algo) : impl_(std::make_unique<Impl>()) {
  impl_->ctx = EVP_MD_CTX_new();
  impl_->md = MdOf(algo);
  if (!impl_->ctx || EVP_DigestInit_ex(impl_->ctx, impl_->md, nullptr) != 1)
    throw std::runtime_error("OpenSSL digest init failed");
}
Digest::~Digest() = default;
Digest::Digest(Digest&&) noexcept = default;
Digest& Digest::operator=(Digest&&) noexcept = default;

void Digest::Update(std::string_view data) {
  EVP_DigestUpdate(impl_->ctx, data.data(), data.size());
}

std::string Digest::Final() {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(impl_->ctx, out, &len);
  EVP_DigestInit_ex(impl_->ctx, impl_->md, nullptr);
  return std::string(reinterpret_cast<char*>(out), len);
}

namespace {
constexpr size_t kNonce = 12, kTag = 16;
}

Result<std::string> Seal(std::string_view key, std::string_view plain, std::string_view aad) {
  if (key.size() != 32) return Status(Code::kInvalidArgument, "a seal key is 32 bytes");
  std::string out(kNonce + plain.size() + kTag, '\0');
  auto* o = reinterpret_cast<unsigned char*>(out.data());
  // Every call checked: a nonce left at zeros would repeat under one key, which GCM does not
  // survive.
  if (RAND_bytes(o, kNonce) != 1)
    return Status(Code::kInternal, "no random bytes for a nonce (RAND_bytes failed)");
  EVP_CIPHER_CTX* c = EVP_CIPHER_CTX_new();
  if (!c) return Status(Code::kInternal, "EVP_CIPHER_CTX_new failed");
  int len = 0, tail = 0;
  const bool ok =
      EVP_EncryptInit_ex(c, EVP_aes_256_gcm(), nullptr,
                         reinterpret_cast<const unsigned char*>(key.data()), o) == 1 &&
      EVP_EncryptUpdate(c, nullptr, &len, reinterpret_cast<const unsigned char*>(aad.data()),
                        static_cast<int>(aad.size())) == 1 &&
      EVP_EncryptUpdate(c, o + kNonce, &len, reinterpret_cast<const unsigned char*>(plain.data()),
                        static_cast<int>(plain.size())) == 1 &&
      EVP_EncryptFinal_ex(c, o + kNonce + len, &tail) == 1 &&
      EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, kTag, o + kNonce + plain.size()) == 1;
  EVP_CIPHER_CTX_free(c);
  if (!ok) return Status(Code::kInternal, "sealing failed (AES-256-GCM)");
  return out;
}

Result<std::string> Unseal(std::string_view key, std::string_view sealed, std::string_view aad) {
  if (sealed.size() < kNonce + kTag || key.size() != 32)
    return Status(Code::kUnauthenticated, "sealed value is malformed");
  const auto* s = reinterpret_cast<const unsigned char*>(sealed.data());
  size_t n = sealed.size() - kNonce - kTag;
  std::string out(n, '\0');
  EVP_CIPHER_CTX* c = EVP_CIPHER_CTX_new();
  int len = 0;
  bool ok = EVP_DecryptInit_ex(c, EVP_aes_256_gcm(), nullptr,
                               reinterpret_cast<const unsigned char*>(key.data()), s) == 1 &&
            EVP_DecryptUpdate(c, nullptr, &len, reinterpret_cast<const unsigned char*>(aad.data()),
                              static_cast<int>(aad.size())) == 1 &&
            EVP_DecryptUpdate(c, reinterpret_cast<unsigned char*>(out.data()), &len, s + kNonce,
                              static_cast<int>(n)) == 1 &&
            EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, kTag,
                                const_cast<unsigned char*>(s + kNonce + n)) == 1 &&
            EVP_DecryptFinal_ex(c, reinterpret_cast<unsigned char*>(out.data()) + len, &len) == 1;
  EVP_CIPHER_CTX_free(c);
  if (!ok)
    return Status(Code::kUnauthenticated,
                  "sealed value does not open with this key (is [api.s3] seal-key the same on "
                  "every node?)");
  return out;
}

std::string MultipartETag(const std::vector<std::string>& raw_md5s) {
  Digest d(Digest::Algo::kMd5);
  for (const auto& m : raw_md5s) d.Update(m);
  return fmt::format("{}-{}", HexEncode(d.Final()), raw_md5s.size());
}

}  // namespace sluice
