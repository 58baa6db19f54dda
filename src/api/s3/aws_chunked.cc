#include "api/s3/aws_chunked.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include <fmt/format.h>

#include "common/secrets.h"

namespace sluice::api::s3 {

namespace {

S3Error Malformed(std::string why) {
  return S3Error{400, "IncompleteBody", "the aws-chunked body is malformed: " + std::move(why)};
}

S3Error BadSignature(std::string what) {
  return S3Error{403, "SignatureDoesNotMatch",
                 fmt::format("the {} signature does not match what was computed", what)};
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

AwsChunkedDecoder::AwsChunkedDecoder(Options o) : o_(std::move(o)), prev_sig_(o_.auth.signature) {}

std::optional<S3Error> AwsChunkedDecoder::OnSizeLine() {
  std::string_view l = line_;
  size_t semi = l.find(';');
  std::string_view hex = l.substr(0, semi);
  if (hex.empty() || hex.size() > 16 || !std::all_of(hex.begin(), hex.end(), ::isxdigit))
    return Malformed("a chunk size is not hexadecimal");
  chunk_size_ = std::stoull(std::string(hex), nullptr, 16);
  chunk_sig_.clear();
  if (semi != std::string_view::npos) {
    std::string_view ext = l.substr(semi + 1);
    constexpr std::string_view kSig = "chunk-signature=";
    if (ext.substr(0, kSig.size()) == kSig) chunk_sig_ = std::string(ext.substr(kSig.size()));
  }
  if (o_.signed_chunks && chunk_sig_.size() != 64)
    return Malformed("a chunk lacks its chunk-signature");
  // As AWS: every signed chunk but the last is at least 8 KiB. Each chunk costs a hash and two
  // HMACs, so one-byte chunks would cost a client little and the server much.
  if (o_.signed_chunks && chunk_size_ > 0 && short_chunk_)
    return S3Error{403, "InvalidChunkSizeError",
                   fmt::format("only the last chunk may be smaller than {} bytes", kMinChunk)};
  short_chunk_ = chunk_size_ < kMinChunk;
  // Compared as what is left, never as a sum: a size line of 16 hex digits would wrap one.
  if (o_.decoded_length &&
      chunk_size_ > *o_.decoded_length - std::min(decoded_, *o_.decoded_length))
    return S3Error{400, "IncompleteBody",
                   "the chunks hold more than x-amz-decoded-content-length declared"};
  if (chunk_size_ > (5ULL << 30) - std::min<uint64_t>(decoded_, 5ULL << 30))
    return S3Error{400, "EntityTooLarge", "your proposed upload exceeds the maximum allowed size"};
  left_ = chunk_size_;
  line_.clear();
  if (chunk_size_ == 0) return OnChunkEnd();
  state_ = State::kData;
  return std::nullopt;
}

std::optional<S3Error> AwsChunkedDecoder::OnChunkEnd() {
  if (o_.signed_chunks) {
    std::string want = SignatureOf(
        o_.signing_key, ChunkStringToSign(o_.auth, prev_sig_, HexEncode(chunk_sha_.Final())));
    if (!ConstantTimeEqualsFixed(want, chunk_sig_)) return BadSignature("chunk");
    prev_sig_ = want;
  }
  if (chunk_size_ == 0) {
    if (o_.decoded_length && decoded_ != *o_.decoded_length)
      return S3Error{400, "IncompleteBody",
                     fmt::format("the chunks hold {} bytes; x-amz-decoded-content-length says {}",
                                 decoded_, *o_.decoded_length)};
    state_ = State::kTrailer;
    return std::nullopt;
  }
  state_ = State::kDataEnd;
  return std::nullopt;
}

std::optional<S3Error> AwsChunkedDecoder::OnTrailerLine() {
  std::string_view l = line_;
  if (l.empty()) {  // the end of the body
    // (Unsigned chunks have no key to check a trailer signature with: one sent is ignored.)
    if (o_.signed_chunks && (!trailer_sig_.empty() || o_.trailer)) {
      if (trailer_sig_.empty()) return Malformed("the trailer lacks x-amz-trailer-signature");
      std::string want =
          SignatureOf(o_.signing_key,
                      TrailerStringToSign(o_.auth, prev_sig_, HexEncode(Sha256(trailer_text_))));
      if (!ConstantTimeEqualsFixed(want, trailer_sig_)) return BadSignature("trailer");
    }
    state_ = State::kDone;
    return std::nullopt;
  }
  size_t colon = l.find(':');
  if (colon == std::string_view::npos) return Malformed("a trailer line has no ':'");
  std::string name = AsciiLower(Trim(l.substr(0, colon)));
  std::string value(Trim(l.substr(colon + 1)));
  if (name == "x-amz-trailer-signature") {
    trailer_sig_ = value;
  } else {
    // (A field not announced would go unchecked: a checksum in it was never compared.)
    if (!o_.trailer || name != o_.announced)
      return Malformed(fmt::format("the trailer {} was not announced by x-amz-trailer", name));
    if (trailers_.size() >= 8) return Malformed("too many trailer fields");
    trailer_text_ += name + ":" + value + "\n";
    trailers_[name] = value;
  }
  line_.clear();
  return std::nullopt;
}

std::optional<S3Error> AwsChunkedDecoder::Feed(const char* data, size_t n, const Out& out,
                                               Status* out_error) {
  size_t i = 0;
  while (i < n) {
    switch (state_) {
      case State::kSize:
      case State::kTrailer: {
        const char* nl = static_cast<const char*>(std::memchr(data + i, '\n', n - i));
        size_t take = (nl ? static_cast<size_t>(nl - (data + i)) : n - i);
        if (state_ == State::kTrailer) {
          trailer_bytes_ += take + (nl ? 1 : 0);
          if (trailer_bytes_ > kMaxTrailer) return Malformed("the trailer is too large");
        }
        if (line_.size() + take > kMaxLine) return Malformed("a line is too long");
        line_.append(data + i, take);
        i += take;
        if (!nl) break;
        ++i;  // the '\n'
        if (line_.empty() || line_.back() != '\r') return Malformed("lines must end in CRLF");
        line_.pop_back();
        auto err = state_ == State::kSize ? OnSizeLine() : OnTrailerLine();
        if (err) return err;
        break;
      }
      case State::kData: {
        size_t take = static_cast<size_t>(std::min<uint64_t>(left_, n - i));
        if (o_.signed_chunks) chunk_sha_.Update(data + i, take);
        Status st = out(data + i, take);
        if (!st.ok()) {
          *out_error = st;
          return S3Error{500, "InternalError", st.message()};
        }
        decoded_ += take;
        left_ -= take;
        i += take;
        if (left_ == 0) {
          auto err = OnChunkEnd();
          if (err) return err;
        }
        break;
      }
      case State::kDataEnd: {
        line_.push_back(data[i++]);
        if (line_.size() == 2) {
          if (line_ != "\r\n") return Malformed("a chunk's data is not followed by CRLF");
          line_.clear();
          state_ = State::kSize;
        }
        break;
      }
      case State::kDone:
        return Malformed("bytes follow the end of the body");
    }
  }
  return std::nullopt;
}

std::optional<S3Error> AwsChunkedDecoder::Finish() const {
  if (state_ != State::kDone)
    return S3Error{400, "IncompleteBody", "the aws-chunked body ended before its final chunk"};
  return std::nullopt;
}

std::string EncodeSignedAwsChunked(const SigV4Auth& auth, std::string_view signing_key,
                                   const std::vector<std::string_view>& chunks,
                                   const std::map<std::string, std::string>& trailers) {
  std::string out, prev = auth.signature;
  auto chunk = [&](std::string_view data) {
    prev = SignatureOf(signing_key, ChunkStringToSign(auth, prev, HexEncode(Sha256(data))));
    out += fmt::format("{:x};chunk-signature={}\r\n", data.size(), prev);
    if (!data.empty()) {
      out += data;
      out += "\r\n";
    }
  };
  for (auto c : chunks)
    if (!c.empty()) chunk(c);
  chunk({});
  if (!trailers.empty()) {
    std::string signed_text;
    for (const auto& [name, value] : trailers) {
      out += name + ":" + value + "\r\n";
      signed_text += name + ":" + value + "\n";
    }
    out +=
        "x-amz-trailer-signature:" +
        SignatureOf(signing_key, TrailerStringToSign(auth, prev, HexEncode(Sha256(signed_text)))) +
        "\r\n";
  }
  return out + "\r\n";
}

}  // namespace sluice::api::s3
