#include "common/sha256.h"

#include <openssl/sha.h>

namespace trnflow {

std::string Sha256Hex(std::string_view data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : digest) out += hex[c >> 4], out += hex[c & 15];
  return out;
}

}  // namespace trnflow
