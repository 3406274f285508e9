#pragma once
// A small HTTP client for the command line's requests to a running `trnflow serve` (a member's
// `trnflow logs`, docs/serve.md). httplib stays inside serve/.
#include <string>
#include <utility>
#include <vector>

namespace trnflow::serve {

struct HttpAnswer {
  int status = 0;     // 0: no answer; `error` says why (refused, timed out, a bad address)
  std::string body;
  std::string error;
};

// GET `path` (with its query) from `base_url` ("http://HOST:PORT"), sending `headers`; waits
// at most `timeout_s` to connect and for each read.
HttpAnswer HttpGet(const std::string& base_url, const std::string& path,
                   const std::vector<std::pair<std::string, std::string>>& headers,
                   double timeout_s);

}  // namespace trnflow::serve
