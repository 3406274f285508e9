#include "serve/client.h"

#include <httplib.h>

namespace trnflow::serve {

HttpAnswer HttpGet(const std::string& base_url, const std::string& path,
                   const std::vector<std::pair<std::string, std::string>>& headers,
                   double timeout_s) {
  HttpAnswer out;
  if (base_url.rfind("http://", 0) != 0) {
    out.error = "not an http:// address";
    return out;
  }
  httplib::Client client(base_url);
  if (!client.is_valid()) {
    out.error = "not an address";
    return out;
  }
  auto seconds = static_cast<time_t>(timeout_s);
  auto micros = static_cast<time_t>((timeout_s - static_cast<double>(seconds)) * 1e6);
  client.set_connection_timeout(seconds, micros);
  client.set_read_timeout(seconds, micros);
  httplib::Headers h;
  for (const auto& [k, v] : headers) h.emplace(k, v);
  auto res = client.Get(path.c_str(), h);
  if (!res) {
    switch (res.error()) {
      case httplib::Error::Connection: out.error = "nothing accepts connections there"; break;
      case httplib::Error::ConnectionTimeout: out.error = "connecting timed out"; break;
      case httplib::Error::Read: out.error = "no answer in time"; break;
      default: out.error = httplib::to_string(res.error());
    }
    return out;
  }
  out.status = res->status;
  out.body = res->body;
  return out;
}

}  // namespace trnflow::serve
