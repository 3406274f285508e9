#pragma once
// SHA-256 as lowercase hex (OpenSSL). For cache keys, artifact digests, pipeline hashes.
#include <string>
#include <string_view>

namespace trnflow {

std::string Sha256Hex(std::string_view data);

// The digest of a file's contents, read in pieces. Throws std::runtime_error if unreadable.
std::string Sha256FileHex(const std::string& path);

// The digest of what remains to be read from an open file descriptor (not closed). Throws
// std::runtime_error naming `what` when a read fails.
std::string Sha256FdHex(int fd, const std::string& what);

}  // namespace trnflow
