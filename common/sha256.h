#pragma once
// SHA-256 as lowercase hex (OpenSSL). For cache keys, artifact digests, pipeline hashes.
#include <string>
#include <string_view>

namespace trnflow {

std::string Sha256Hex(std::string_view data);

// The digest of a file's contents, read in pieces. Throws std::runtime_error if unreadable.
std::string Sha256FileHex(const std::string& path);

}  // namespace trnflow
