#include "common/sha256.h"

#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <memory>
#include <stdexcept>

namespace trnflow {
namespace {

using Ctx = std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)>;

Ctx NewSha256() {
  Ctx ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("sha256: cannot initialise OpenSSL");
  return ctx;
}

std::string FinishHex(EVP_MD_CTX* ctx) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(ctx, digest, &n);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < n; ++i) out += hex[digest[i] >> 4], out += hex[digest[i] & 15];
  return out;
}

}  // namespace

std::string Sha256Hex(std::string_view data) {
  Ctx ctx = NewSha256();
  EVP_DigestUpdate(ctx.get(), data.data(), data.size());
  return FinishHex(ctx.get());
}

std::string Sha256FileHex(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  Ctx ctx = NewSha256();
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0)
    EVP_DigestUpdate(ctx.get(), buf, static_cast<size_t>(in.gcount()));
  if (in.bad()) throw std::runtime_error("cannot read " + path);
  return FinishHex(ctx.get());
}

std::string Sha256FdHex(int fd, const std::string& what) {
  Ctx ctx = NewSha256();
  char buf[1 << 16];
  while (true) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("cannot read " + what);
    }
    EVP_DigestUpdate(ctx.get(), buf, static_cast<size_t>(n));
  }
  return FinishHex(ctx.get());
}

}  // namespace trnflow
