#pragma once
// Where trnflow keeps things and how it finds the catalog (INTERFACES.md "Environment").
#include <string>

namespace trnflow {

// The daemons' catalog login: TRNFLOW_DATABASE_URL, else /etc/trnflow/daemon.url (readable only
// by the daemons' user), else the caller's own login over the local socket
// (postgresql:///trnflow, peer authentication). TRNFLOW_CONFIG_DIR replaces /etc/trnflow.
std::string DatabaseUrl();
// The schema owner, for `db migrate` and `project`: TRNFLOW_ADMIN_DATABASE_URL, else
// /etc/trnflow/owner.url, else DatabaseUrl().
std::string AdminDatabaseUrl();
// Where the site's configuration and secrets are kept: TRNFLOW_CONFIG_DIR, else /etc/trnflow.
std::string ConfigDir();
// TRNFLOW_HOME, or /var/lib/trnflow for root, or ~/.local/share/trnflow.
std::string HomeDir();
// The URL with any password replaced by "***", safe for logs and errors.
std::string RedactUrl(const std::string& url);
// `text` (an error message) with any URL's password and the password of `url` hidden.
std::string RedactSecrets(std::string text, const std::string& url);

}  // namespace trnflow
