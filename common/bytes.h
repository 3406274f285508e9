#pragma once
// Sizes people type: `--max-bytes 1GB`, `--job-limits as=16G`.
#include <cstdint>
#include <optional>
#include <string>

namespace trnflow {

// "1024", "64K", "16G", "2GiB" (powers of 1024: K M G T, or KiB MiB GiB TiB) and "1KB", "1GB"
// (powers of 1000: KB MB GB TB); a trailing "B" alone means bytes. nullopt for anything else
// (a sign, a fraction, an unknown suffix, or more than 2^64 - 1 bytes), never a guess.
std::optional<uint64_t> ParseBytes(const std::string& text);

}  // namespace trnflow
