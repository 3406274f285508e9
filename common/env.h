#pragma once
// Where trnflow keeps things and how it finds the catalog (INTERFACES.md "Environment").
#include <string>

namespace trnflow {

// TRNFLOW_DATABASE_URL, or the local database that ops/setup.sh creates.
std::string DatabaseUrl();
// TRNFLOW_HOME, or /var/lib/trnflow for root, or ~/.local/share/trnflow.
std::string HomeDir();
// The URL with any password replaced by "***", safe for logs and errors.
std::string RedactUrl(const std::string& url);

}  // namespace trnflow
