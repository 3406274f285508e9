#pragma once
// Error types that abort a whole operation, and the process exit codes of INTERFACES.md.
// Expected failures (bad YAML, a failed stage, a missing row) are values, not exceptions.
#include <stdexcept>
#include <string>

namespace trnflow {

enum ExitCode : int {
  kExitOk = 0,
  kExitRunFailed = 1,
  kExitBadInput = 2,
  kExitNoCatalog = 3,
  kExitPermissionDenied = 4,  // refused: by PostgreSQL (this login may not) or by a budget
  kExitInterrupted = 130      // Ctrl-C, as shells report 128 + SIGINT
};

// The catalog cannot be reached (or cannot be used by this binary). what() is one line that
// names the URL with its password hidden and says how to fix it.
class CatalogUnavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad input from a person: an unknown run id, a malformed flag. what() says how to fix it.
class UserError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The catalog refused: this login may not do that (not a member with write access, a role
// without the grant). what() says what was refused and who can grant it.
class PermissionDenied : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A policy refused a well-formed request: the plan's estimate exceeds what a budget has left.
// Exit code 4, like PermissionDenied: the input is fine, someone must allow it (raise the
// budget) or override (--force). what() gives the numbers and both ways out.
class Refused : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace trnflow
