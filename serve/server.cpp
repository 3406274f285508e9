#include "serve/server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/embedded.h"
#include "common/error.h"
#include "common/log.h"
#include "common/sha256.h"
#include "schema/catalog.h"  // the pool hands the /api views the whole Catalog
#include "schema/serve_catalog.h"
#include "serve/event_hub.h"
#include "serve/metrics.h"

namespace trnflow::serve::assets {
const std::vector<trnflow::EmbeddedFile>& Files();
}

namespace trnflow::serve {
namespace {

// Connections for requests, reused. A lease that acted as a role goes back to the login's own
// role before it is reused; one that cannot is dropped.
class CatalogPool {
 public:
  explicit CatalogPool(std::string url) : url_(std::move(url)) {}

  class Lease {
   public:
    Lease(CatalogPool& pool, std::unique_ptr<schema::Catalog> c) : pool_(pool), c_(std::move(c)) {}
    ~Lease() {
      if (!c_) return;
      if (acting_) {
        try {
          c_->ActAs("");
        } catch (const std::exception&) {
          return;  // dropped: it may still act as someone
        }
      }
      pool_.Return(std::move(c_));
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    // The whole catalog: only for the /api views and metrics the command line hands in
    // (Options::views, Options::metrics), which are written over it.
    schema::Catalog& whole() { return *c_; }
    // Everything serve/ calls itself goes through its door.
    schema::ServeCatalog* operator->() { return c_.get(); }
    void ActAs(const std::string& role) {
      acting_ = true;
      c_->ActAs(role);
    }

   private:
    CatalogPool& pool_;
    std::unique_ptr<schema::Catalog> c_;
    bool acting_ = false;
  };

  std::unique_ptr<Lease> Take() {
    {
      std::scoped_lock lock(mu_);
      if (!idle_.empty()) {
        auto c = std::move(idle_.back());
        idle_.pop_back();
        return std::make_unique<Lease>(*this, std::move(c));
      }
    }
    return std::make_unique<Lease>(*this, std::make_unique<schema::Catalog>(url_));
  }

 private:
  void Return(std::unique_ptr<schema::Catalog> c) {
    std::scoped_lock lock(mu_);
    if (idle_.size() < 16) idle_.push_back(std::move(c));
  }

  std::string url_;
  std::mutex mu_;
  std::vector<std::unique_ptr<schema::Catalog>> idle_;  // guarded by mu_
};

// Answers shared by the browsers that follow the same page, as a proxy cache serves while it
// revalidates. A page that follows the event stream asks with ?after=ID, the newest change it
// has been told of. An answer is marked with the change the hub had settled when its read
// began (every change up to it is in it). The newest answer for the request's role and
// parameters is given at once; when it is older than ID or than a second (running attempts'
// dollars grow with time), one read in the background replaces it, and the page, seeing a mark
// older than what it asked for (X-Trnflow-Change), asks again. So fifty browsers told of the
// same change cost one read of the catalog, and none waits for it. A page opening asks with
// ?after=latest: the kept answer if it is under a second old, else it waits for a read (one
// for all who open together). Only a request no answer is kept for (none asked for it in a
// minute) reads while it waits. Requests without ?after (the CLI's equivalent, scripts)
// always read the catalog themselves; what they read is kept for the others. Answers over
// 1 MiB (a whole 10,000-stage run) are not kept: at most 256 answers, 256 MiB.
class SharedAnswers {
 public:
  using Body = std::optional<std::string>;
  using Read = std::function<Body()>;
  struct Answer {
    Body body;
    int64_t change = 0;  // every change up to this one is in it
  };

  explicit SharedAnswers(std::function<int64_t()> settled)
      : settled_(std::move(settled)), refresher_([this] { Refresh(); }) {}
  ~SharedAnswers() {
    {
      std::scoped_lock lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    refresher_.join();
  }
  SharedAnswers(const SharedAnswers&) = delete;
  SharedAnswers& operator=(const SharedAnswers&) = delete;

  // A read of its own (a request without ?after), kept for those who ask later with ?after.
  Answer ReadAndKeep(const std::string& key, const Read& read) {
    Answer a{std::nullopt, settled_()};
    a.body = read();
    std::scoped_lock lock(mu_);
    if (entries_.size() >= kMaxEntries) Evict();
    Keep(entries_[key], a);
    cv_.notify_all();
    return a;
  }

  // The answer for `key` as of change `after`: a kept one that shows it, else the newest kept
  // (and a read in the background), else one read now. `opening` (?after=latest): the newest
  // kept only if it is under a second old, else one read now (shared with those who wait).
  Answer Get(const std::string& key, int64_t after, bool opening, const Read& read) {
    std::unique_lock lock(mu_);
    for (;;) {
      auto it = entries_.find(key);
      if (it == entries_.end()) break;
      Entry& e = it->second;
      auto age = Clock::now() - e.at;
      if (e.ready && e.change >= after && age < kFresh) return {e.body, e.change};
      if (e.ready && age < (opening ? kFresh : kKeep)) {
        if (!e.reading) {
          e.reading = true;
          queue_.emplace_back(key, read);
          cv_.notify_all();
        }
        return {e.body, e.change};
      }
      if (!e.reading) break;
      cv_.wait(lock);  // a read is under way: its answer may do
    }
    if (entries_.size() >= kMaxEntries) Evict();
    entries_[key].reading = true;
    lock.unlock();
    return Store(key, read);
  }

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr auto kFresh = std::chrono::seconds(1);
  static constexpr auto kKeep = std::chrono::seconds(60);
  static constexpr size_t kMaxEntries = 256;
  static constexpr size_t kMaxBody = 1 << 20;
  struct Entry {
    bool ready = false;
    bool reading = false;
    int64_t change = 0;
    Clock::time_point at;
    Body body;
  };

  // Reads `key`'s answer (its entry is marked as being read) and keeps it.
  Answer Store(const std::string& key, const Read& read) {
    Answer a{std::nullopt, settled_()};
    try {
      a.body = read();
    } catch (...) {
      std::scoped_lock lock(mu_);
      entries_[key].reading = false;
      cv_.notify_all();
      throw;
    }
    std::scoped_lock lock(mu_);
    Keep(entries_[key], a);
    entries_[key].reading = false;
    cv_.notify_all();
    return a;
  }

  // Keeps `a` in `e` unless `e` holds a newer answer already (read meanwhile by a request
  // without ?after).
  static void Keep(Entry& e, const Answer& a) {
    if (e.ready && e.change > a.change) return;
    if (a.body && a.body->size() > kMaxBody) return;
    e.ready = true;
    e.change = a.change;
    e.at = Clock::now();
    e.body = a.body;
  }

  // The background reads, one at a time.
  void Refresh() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      auto [key, read] = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      try {
        Store(key, read);
      } catch (const std::exception& e) {
        Logger("serve")->warn("refreshing a shared answer failed: {}", e.what());
      }
      lock.lock();
    }
  }

  // Drops the answers no one asked for in a minute (or, when all are newer, the oldest half).
  void Evict() {
    auto now = Clock::now();
    std::erase_if(entries_, [&](const auto& kv) {
      return !kv.second.reading && now - kv.second.at >= kKeep;
    });
    while (entries_.size() >= kMaxEntries / 2) {
      auto oldest = entries_.end();
      for (auto it = entries_.begin(); it != entries_.end(); ++it)
        if (!it->second.reading && (oldest == entries_.end() || it->second.at < oldest->second.at))
          oldest = it;
      if (oldest == entries_.end()) break;
      entries_.erase(oldest);
    }
  }

  std::function<int64_t()> settled_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Entry> entries_;               // guarded by mu_
  std::deque<std::pair<std::string, Read>> queue_;     // guarded by mu_
  bool stop_ = false;                                  // guarded by mu_
  std::thread refresher_;  // last: started once the rest is built
};

// Who a request is: in --auth proxy, the role named by the proxy's header and the projects it
// may see; in --auth local, the login itself (everything).
struct Who {
  std::string role;  // "" for the login itself
  std::set<std::string> projects;
  bool all = false;
};

class HttpError : public std::runtime_error {
 public:
  HttpError(int status, const std::string& message)
      : std::runtime_error(message), status(status) {}
  int status;
};

std::string ErrorJson(const std::string& message) {
  return nlohmann::json({{"error", message}}).dump() + "\n";
}

std::string ContentType(const std::string& name) {
  auto ends = [&](const char* suffix) {
    std::string s = suffix;
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  if (ends(".html")) return "text/html; charset=utf-8";
  if (ends(".js")) return "text/javascript; charset=utf-8";
  if (ends(".css")) return "text/css; charset=utf-8";
  if (ends(".svg")) return "image/svg+xml";
  return "application/octet-stream";
}

const EmbeddedFile* Asset(const std::string& name) {
  for (const auto& f : assets::Files())
    if (f.name == name) return &f;
  return nullptr;
}


// ---- Connections -----------------------------------------------------------------------
//
// httplib accepts connections and hands each to a thread of its pool for as long as it is
// open; its own reading gives every recv() the read timeout anew, so a client that sends a
// byte of its headers every few seconds holds a thread for hours, and a few hundred such
// connections hold them all. GuardedServer serves each connection itself (httplib's
// process_and_close_socket is virtual; process_request, which parses and routes one request,
// is ours to call), so that a request's line and headers must arrive within a deadline, and a
// client address holds only so many connections that have not yet proved who they are.

using Clock = std::chrono::steady_clock;

// The address a connection comes from ("127.0.0.1", "::1"; IPv4-mapped IPv6 as IPv4).
std::string SocketAddress(int sock, bool peer, int* port = nullptr) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  int rc = peer ? getpeername(sock, reinterpret_cast<sockaddr*>(&a), &len)
                : getsockname(sock, reinterpret_cast<sockaddr*>(&a), &len);
  if (rc != 0) return "";
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&a);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
    if (port) *port = ntohs(in->sin_port);
  } else if (a.ss_family == AF_INET6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&a);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr))
      inet_ntop(AF_INET, &in6->sin6_addr.s6_addr[12], text, sizeof text);
    else
      inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text);
    if (port) *port = ntohs(in6->sin6_port);
  } else {
    return "local";
  }
  return text;
}

// Waits for `events` on `sock` for at most `ms` (0: only looks); false on timeout or error.
bool PollFor(int sock, short events, int64_t ms) {
  pollfd p{sock, events, 0};
  for (;;) {
    int rc = ::poll(&p, 1, static_cast<int>(std::clamp<int64_t>(ms, 0, 1 << 30)));
    if (rc < 0 && errno == EINTR) continue;
    return rc > 0 && (p.revents & (events | POLLHUP | POLLERR)) != 0;
  }
}

// One connection's socket, read through a buffer (httplib reads a request line byte by byte).
// Until HeadersDone, a read waits no later than the request's deadline, however the bytes
// trickle in; after it (the body, none here but POSTs' empty ones) each read waits at most the
// read timeout, and each write the write timeout.
class DeadlineStream final : public httplib::Stream {
 public:
  DeadlineStream(int sock, int64_t read_timeout_ms, int64_t write_timeout_ms)
      : sock_(sock), read_timeout_ms_(read_timeout_ms), write_timeout_ms_(write_timeout_ms) {}

  void StartRequest(Clock::time_point deadline) { deadline_ = deadline; }
  void HeadersDone() { deadline_ = Clock::time_point::max(); }
  bool Buffered() const { return pos_ < len_; }

  bool is_readable() const override { return Buffered() || PollFor(sock_, POLLIN, ReadWaitMs()); }
  bool is_writable() const override { return PollFor(sock_, POLLOUT, write_timeout_ms_); }

  ssize_t read(char* ptr, size_t size) override {
    // Past the deadline nothing more is read, however fast it comes (endless header lines).
    if (deadline_ != Clock::time_point::max() && Clock::now() >= deadline_) return -1;
    if (!Buffered()) {
      if (!PollFor(sock_, POLLIN, ReadWaitMs())) return -1;
      ssize_t n;
      do {
        n = ::recv(sock_, buf_, sizeof buf_, 0);
      } while (n < 0 && errno == EINTR);
      if (n <= 0) return n;
      pos_ = 0;
      len_ = static_cast<size_t>(n);
    }
    size_t n = std::min(size, len_ - pos_);
    std::memcpy(ptr, buf_ + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }

  using httplib::Stream::write;
  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    ssize_t n;
    do {
      n = ::send(sock_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = SocketAddress(sock_, true, &port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = SocketAddress(sock_, false, &port);
  }
  socket_t socket() const override { return sock_; }

 private:
  int64_t ReadWaitMs() const {
    if (deadline_ == Clock::time_point::max()) return read_timeout_ms_;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now());
    return std::clamp<int64_t>(left.count(), 0, read_timeout_ms_);
  }

  int sock_;
  int64_t read_timeout_ms_, write_timeout_ms_;
  Clock::time_point deadline_ = Clock::time_point::max();
  char buf_[4096];
  size_t pos_ = 0, len_ = 0;
};

// Connections not yet authenticated, by client address.
class PendingCaps {
 public:
  explicit PendingCaps(int max) : max_(max) {}
  bool TryAdd(const std::string& address) {
    std::scoped_lock lock(mu_);
    int& n = pending_[address];
    if (n >= max_) return false;
    ++n;
    return true;
  }
  void Remove(const std::string& address) {
    std::scoped_lock lock(mu_);
    auto it = pending_.find(address);
    if (it != pending_.end() && --it->second <= 0) pending_.erase(it);
  }

 private:
  const int max_;
  std::mutex mu_;
  std::unordered_map<std::string, int> pending_;  // guarded by mu_
};

// The connection a thread serves: counted as pending for its address until a request on it
// presents the token or the proxy secret (Authenticated).
class Connection {
 public:
  Connection(PendingCaps& caps, std::string address) : caps_(caps), address_(std::move(address)) {
    admitted_ = caps_.TryAdd(address_);
  }
  ~Connection() { Authenticated(); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  bool admitted() const { return admitted_; }
  const std::string& address() const { return address_; }
  // A Unix socket's peer that is this process's user or root: the file system let it in.
  bool trusted_peer() const { return trusted_peer_; }
  void TrustPeer() {
    trusted_peer_ = true;
    Authenticated();
  }
  void Authenticated() {
    if (admitted_ && pending_) caps_.Remove(address_);
    pending_ = false;
  }

 private:
  PendingCaps& caps_;
  std::string address_;
  bool admitted_ = false;
  bool pending_ = true;
  bool trusted_peer_ = false;
};

// The uid of a Unix socket's peer, or -1 (not a Unix socket, or unknown).
int64_t PeerUid(int sock) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (getsockname(sock, reinterpret_cast<sockaddr*>(&a), &len) != 0 || a.ss_family != AF_UNIX)
    return -1;
  ucred cred{};
  socklen_t n = sizeof cred;
  if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &n) != 0) return -1;
  return cred.uid;
}

// The connection this thread is serving (handlers run on it), or null.
thread_local Connection* tls_connection = nullptr;

class GuardedServer final : public httplib::Server {
 public:
  GuardedServer(double header_timeout_s, int max_pending_per_client)
      : header_timeout_(std::chrono::duration_cast<Clock::duration>(
            std::chrono::duration<double>(header_timeout_s))),
        caps_(max_pending_per_client) {}

 private:
  bool process_and_close_socket(socket_t sock) override {
    bool ret = false;
    {
      int64_t uid = PeerUid(sock);
      Connection conn(caps_, uid >= 0 ? "uid " + std::to_string(uid) : SocketAddress(sock, true));
      if (uid >= 0 && uid != 0 && uid != static_cast<int64_t>(::geteuid())) {
        // A Unix socket someone loosened the mode of: still only its user and root.
        Logger("serve")->warn("refused a connection from uid {} on the Unix socket", uid);
      } else if (!conn.admitted()) {
        RefuseBusy(sock, conn.address());
      } else {
        if (uid >= 0) conn.TrustPeer();
        tls_connection = &conn;
        ret = Serve(sock);
        tls_connection = nullptr;
      }
    }
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return ret;
  }

  // httplib's keep-alive loop, with a deadline for each request's line and headers.
  bool Serve(int sock) {
    DeadlineStream strm(sock, read_timeout_sec_ * 1000 + read_timeout_usec_ / 1000,
                        write_timeout_sec_ * 1000 + write_timeout_usec_ / 1000);
    bool ret = false;
    for (size_t count = keep_alive_max_count_; count > 0 && svr_sock_ != INVALID_SOCKET; --count) {
      if (!strm.Buffered() && !WaitForRequest(sock)) break;
      strm.StartRequest(Clock::now() + header_timeout_);
      bool closed = false, headers_done = false;
      ret = process_request(strm, count == 1, closed, [&](httplib::Request&) {
        strm.HeadersDone();
        headers_done = true;
      });
      // A request whose headers never came whole (answered 400) ends the connection: what
      // follows in it is not a request.
      if (!ret || closed || !headers_done) break;
    }
    return ret;
  }

  // Whether a request starts within the keep-alive timeout (looking every 100 ms whether the
  // server is stopping).
  bool WaitForRequest(int sock) const {
    auto until = Clock::now() + std::chrono::seconds(keep_alive_timeout_sec_);
    while (svr_sock_ != INVALID_SOCKET) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
      if (left.count() <= 0) return false;
      if (PollFor(sock, POLLIN, std::min<int64_t>(left.count(), 100))) return true;
    }
    return false;
  }

  void RefuseBusy(int sock, const std::string& address) {
    static const std::string body =
        ErrorJson("too many connections from this address that have not authenticated");
    std::string out = "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n"
                      "Connection: close\r\nContent-Length: " +
                      std::to_string(body.size()) + "\r\n\r\n" + body;
    [[maybe_unused]] auto sent = ::send(sock, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    // Logged at most every 10 s: a flood must not flood the log too.
    auto now = Clock::now();
    std::scoped_lock lock(log_mu_);
    ++refused_;
    if (now - last_log_ >= std::chrono::seconds(10)) {
      Logger("serve")->warn("refused {} connection(s) over --max-pending-per-client (latest from {})",
                            refused_, address);
      refused_ = 0;
      last_log_ = now;
    }
  }

  Clock::duration header_timeout_;
  PendingCaps caps_;
  std::mutex log_mu_;
  Clock::time_point last_log_;  // guarded by log_mu_
  int refused_ = 0;             // guarded by log_mu_
};

// Equal, in time that does not depend on where they differ (both are hashed first, so their
// lengths do not show either).
bool SecretEquals(const std::string& given, const std::string& secret) {
  std::string a = Sha256Hex(given), b = Sha256Hex(secret);
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0 && a.size() == b.size();
}

// The value of cookie `name` in a Cookie header, "" when absent.
std::string CookieValue(const std::string& header, const std::string& name) {
  size_t from = 0;
  while (from < header.size()) {
    size_t end = std::min(header.find(';', from), header.size());
    std::string part = header.substr(from, end - from);
    size_t start = part.find_first_not_of(' ');
    if (start != std::string::npos) part = part.substr(start);
    if (part.size() > name.size() && part.compare(0, name.size(), name) == 0 &&
        part[name.size()] == '=')
      return part.substr(name.size() + 1);
    from = end + 1;
  }
  return "";
}

// `target` (path?query) without its token= parameters, to redirect to once the cookie is
// set; never a protocol-relative "//host" (an open redirect).
std::string WithoutToken(const std::string& target) {
  size_t q = target.find('?');
  std::string path = target.substr(0, q);
  if (path.empty() || path[0] != '/' || path.rfind("//", 0) == 0) path = "/";
  std::string query;
  if (q != std::string::npos) {
    std::string rest = target.substr(q + 1);
    size_t from = 0;
    while (from <= rest.size()) {
      size_t end = std::min(rest.find('&', from), rest.size());
      std::string part = rest.substr(from, end - from);
      if (!part.empty() && part != "token" && part.rfind("token=", 0) != 0)
        query += (query.empty() ? "" : "&") + part;
      from = end + 1;
    }
  }
  return query.empty() ? path : path + "?" + query;
}

class Dashboard {
 public:
  explicit Dashboard(const Options& o)
      : o_(o),
        pool_(o.database_url),
        hub_(o.database_url),
        shared_([this] { return hub_.Latest(); }),
        csrf_secret_(schema::RandomSecret()) {}

  void Run(const std::atomic<bool>& stop, const std::function<void(int)>& on_listening) {
    auto log = Logger("serve");
    bool unix_socket = !o_.unix_path.empty();
    if (unix_socket && o_.auth != Auth::kLocal)
      throw UserError("--listen unix:PATH is for --auth local (the proxy reaches the dashboard "
                      "over TCP on loopback, with its secret)");
    if (o_.auth == Auth::kLocal && !unix_socket && !IsLoopback(o_.host))
      throw UserError("--auth local serves everything the daemons' login sees to whoever "
                      "connects; it listens on loopback addresses only (not " + o_.host +
                      "). Put a reverse proxy in front and use --auth proxy (docs/serve.md)");
    secret_ = o_.auth == Auth::kLocal
                  ? LoadOrCreateSecret(o_.token_file, "--token-file")
                  : LoadOrCreateSecret(o_.proxy_secret_file, "--proxy-secret-file");
    // Through a Unix socket (ssh -L PORT:PATH, curl --unix-socket) browsers name localhost.
    allowed_hosts_ = AllowedHosts(unix_socket ? "127.0.0.1" : o_.host, o_.allowed_hosts);
    if (unix_socket) allowed_hosts_.push_back("[::1]");
    hub_.Start();  // throws CatalogUnavailable: the catalog is reached before listening
    GuardedServer svr(o_.header_timeout_s, o_.max_pending_per_client);
    // Nothing here takes a body: a cancel, resume or retry is a POST with an empty one.
    svr.set_payload_max_length(64 * 1024);
    // A connection holds a thread while it is open (keep-alive included). A browser tab holds
    // two: its event stream and the connection its reads reuse. Room for both of every
    // stream there may be, and for others' requests.
    int threads = 2 * o_.max_clients + 16;
    svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    svr.set_keep_alive_timeout(5);
    // A page re-reads every half second: its connection stays open rather than being closed
    // after httplib's default of 5 requests.
    svr.set_keep_alive_max_count(1000);
    int listening = -1;
    svr.set_socket_options([&listening](socket_t sock) {
      httplib::default_socket_options(sock);
      listening = sock;
    });
    svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      return Gate(req, res);
    });
    Routes(svr);
    // httplib 0.11 binds TCP only: on a Unix socket it binds a loopback port it never listens
    // on, whose descriptor then becomes the Unix socket (dup2), which its accept loop serves.
    std::string bind_host = unix_socket ? "127.0.0.1" : o_.host;
    int port = o_.port == 0 || unix_socket ? svr.bind_to_any_port(bind_host) : o_.port;
    if (o_.port != 0 && !unix_socket && !svr.bind_to_port(o_.host, o_.port)) port = -1;
    if (unix_socket && port > 0 && listening >= 0) {
      ListenOnUnixSocket(o_.unix_path, listening);
      port = 0;
    }
    // httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, fixed when Debian built
    // it): fifty browsers connecting at once overflow it, and a dropped connection attempt is
    // retried only after a second. Listening again on the socket raises the backlog.
    if (port >= 0 && listening >= 0) ::listen(listening, 1024);
    if (port < 0 || (port == 0 && !unix_socket)) {
      hub_.Stop();
      throw UserError("cannot listen on " + o_.host + ":" + std::to_string(o_.port) +
                      " (in use, or not an address of this host); choose another with --listen");
    }
    // Two dashboards on one host share the browser's cookies for it (cookies ignore ports).
    cookie_name_ = "trnflow_token_" + std::to_string(port);
    std::thread server([&] { svr.listen_after_bind(); });
    if (unix_socket)
      log->info("listening on unix:{} auth=local", o_.unix_path);
    else
      log->info("listening on http://{}:{} auth={}", o_.host, port,
                o_.auth == Auth::kLocal ? "local" : "proxy");
    on_listening(port);
    while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    hub_.Stop();  // wakes every event stream, which then ends
    svr.stop();
    server.join();
    if (unix_socket) ::unlink(o_.unix_path.c_str());
  }

  // Makes `fd` (httplib's listening descriptor) a Unix socket listening at `path`, mode 0600;
  // its directory is made 0700 when missing. A socket left at `path` by an earlier run is
  // replaced; any other file there is refused.
  static void ListenOnUnixSocket(const std::string& path, int fd) {
    auto fail = [&](const std::string& why) {
      return UserError("--listen unix:" + path + ": " + why);
    };
    sockaddr_un a{};
    if (path.empty() || path[0] != '/' || path.size() >= sizeof a.sun_path)
      throw fail("an absolute path of at most " + std::to_string(sizeof a.sun_path - 1) +
                 " bytes");
    std::string dir = path.substr(0, path.rfind('/'));
    struct stat st {};
    if (!dir.empty() && ::stat(dir.c_str(), &st) != 0) {
      if (::mkdir(dir.c_str(), 0700) != 0)
        throw fail("cannot make " + dir + " (" + std::strerror(errno) + ")");
    }
    if (::lstat(path.c_str(), &st) == 0) {
      if (!S_ISSOCK(st.st_mode)) throw fail("a file that is not a socket is there");
      ::unlink(path.c_str());
    }
    int u = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (u < 0) throw fail(std::strerror(errno));
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, path.data(), path.size());
    mode_t old = ::umask(0177);  // the socket is made 0600: connecting needs write permission
    int rc = ::bind(u, reinterpret_cast<sockaddr*>(&a), sizeof a);
    int bind_errno = errno;
    ::umask(old);
    if (rc != 0 || ::listen(u, 1024) != 0 || ::dup2(u, fd) < 0) {
      ::close(u);
      throw fail(std::string("cannot listen (") + std::strerror(rc != 0 ? bind_errno : errno) + ")");
    }
    ::close(u);
  }

 private:
  // Before any route but /healthz: the Host must be one of this dashboard's names (a page of
  // another site reaching it through a DNS name it points here is refused), and the request
  // must carry the token (--auth local) or the proxy's secret (--auth proxy): being able to
  // connect, as every process on the host can to a loopback port, proves nothing.
  httplib::Server::HandlerResponse Gate(const httplib::Request& req, httplib::Response& res) {
    using R = httplib::Server::HandlerResponse;
    if (req.path == "/healthz") return R::Unhandled;
    auto refuse = [&](int status, const std::string& message) {
      SecurityHeaders(res);
      res.status = status;
      res.set_header("Cache-Control", "no-store");
      res.set_content(ErrorJson(message), "application/json");
      return R::Handled;
    };
    std::string host = req.get_header_value("Host");
    if (!HostAllowed(host, allowed_hosts_))
      return refuse(403, "Host " + host + " is not a name of this dashboard (--allowed-host "
                         "adds one; docs/serve.md)");
    // A member's `trnflow logs`: the ticket their own catalog login was given is the
    // credential (checked and spent by the route itself), not the token or the proxy's secret.
    if (req.path == "/api/log-ticket") return R::Unhandled;
    std::string bearer = req.get_header_value("Authorization");
    bearer = bearer.rfind("Bearer ", 0) == 0 ? bearer.substr(7) : "";
    if (o_.auth == Auth::kProxy) {
      std::string given = req.get_header_value("X-Trnflow-Proxy-Secret");
      if (given.empty()) given = bearer;
      if (given.empty() || !SecretEquals(given, secret_))
        return refuse(401, "no valid X-Trnflow-Proxy-Secret: requests reach this dashboard "
                           "through the reverse proxy that adds it (docs/serve.md)");
      if (tls_connection) tls_connection->Authenticated();
      return R::Unhandled;
    }
    if (tls_connection && tls_connection->trusted_peer()) return R::Unhandled;
    std::string cookie = CookieValue(req.get_header_value("Cookie"), cookie_name_);
    std::string query = req.get_param_value("token");
    bool ok = false;
    for (const auto* given : {&bearer, &cookie, &query})
      if (!given->empty() && SecretEquals(*given, secret_)) ok = true;
    if (!ok) {
      res.set_header("WWW-Authenticate", "Bearer realm=\"trnflow\"");
      return refuse(401, "this dashboard needs its token: open the address `trnflow serve` "
                         "printed (ending in /?token=...), or send Authorization: Bearer "
                         "with the token kept in " + o_.token_file + " (docs/serve.md)");
    }
    if (tls_connection) tls_connection->Authenticated();
    // A page opened with ?token=: the token becomes a cookie and leaves the address bar.
    if (!query.empty() && req.method == "GET" && req.path.rfind("/api/", 0) != 0 &&
        req.path != "/metrics") {
      SecurityHeaders(res);
      res.set_header("Set-Cookie", cookie_name_ + "=" + secret_ +
                                       "; Path=/; HttpOnly; SameSite=Lax");
      res.set_header("Cache-Control", "no-store");
      res.set_redirect(WithoutToken(req.target), 303);
      return R::Handled;
    }
    return R::Unhandled;
  }

  // The request's identity, or an HttpError (401: no header; 403: not someone it may act as).
  Who Identify(const httplib::Request& req) {
    Who who;
    if (o_.auth == Auth::kLocal) {  // the token was checked (Gate)
      who.all = true;
      return who;
    }
    std::string user = req.get_header_value(o_.user_header.c_str());
    if (user.empty())
      throw HttpError(401, "no " + o_.user_header + " header: requests reach the dashboard "
                           "through the reverse proxy that authenticates people");
    auto c = pool_.Take();
    auto projects = (*c)->MemberProjects(user);
    if (projects.empty())
      throw HttpError(403, "'" + user + "' is not a project member the dashboard may act as "
                           "(`trnflow project grant PROJECT ROLE --read` makes one)");
    who.role = user;
    who.projects.insert(projects.begin(), projects.end());
    return who;
  }

  // A connection acting as the request's role.
  std::unique_ptr<CatalogPool::Lease> ConnectionFor(const Who& who) {
    auto c = pool_.Take();
    if (!who.role.empty()) c->ActAs(who.role);
    return c;
  }

  static void SecurityHeaders(httplib::Response& res) {
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_header("X-Frame-Options", "DENY");
    res.set_header("Referrer-Policy", "no-referrer");
    res.set_header("Content-Security-Policy",
                   "default-src 'self'; img-src 'self' data:; style-src 'self'; "
                   "script-src 'self'; connect-src 'self'; frame-ancestors 'none'");
  }

  // Runs `body`, mapping errors to HTTP statuses with a JSON body.
  template <typename F>
  void Guarded(httplib::Response& res, F&& body) {
    SecurityHeaders(res);
    try {
      body();
    } catch (const HttpError& e) {
      res.status = e.status;
      res.set_content(ErrorJson(e.what()), "application/json");
    } catch (const UserError& e) {
      res.status = 400;
      res.set_content(ErrorJson(e.what()), "application/json");
    } catch (const PermissionDenied& e) {
      res.status = 403;
      res.set_content(ErrorJson(e.what()), "application/json");
    } catch (const Refused& e) {
      res.status = 403;
      res.set_content(ErrorJson(e.what()), "application/json");
    } catch (const CatalogUnavailable& e) {
      res.status = 503;
      res.set_content(ErrorJson(e.what()), "application/json");
    } catch (const std::exception& e) {
      Logger("serve")->error("request failed: {}", e.what());
      res.status = 500;
      res.set_content(ErrorJson("internal error; see the dashboard's log"), "application/json");
    }
  }

  void Api(httplib::Server& svr, const std::string& pattern, const std::string& view) {
    svr.Get(pattern, [this, view](const httplib::Request& req, httplib::Response& res) {
      Guarded(res, [&] {
        auto it = o_.views.find(view);
        if (it == o_.views.end()) throw HttpError(404, "no such resource");
        Who who = Identify(req);
        ApiRequest r;
        for (const auto& [k, v] : req.params)
          if (k != "after") r.params.try_emplace(k, v);
        if (req.matches.size() > 1) r.id = req.matches[1];
        // The read may run later, in the background (SharedAnswers): it owns what it uses.
        SharedAnswers::Read read = [this, who, r, answer = it->second] {
          try {
            auto c = ConnectionFor(who);
            return answer((*c).whole(), r);
          } catch (const CatalogUnavailable&) {
            // A pooled connection the server dropped (a restart): reads are safe to try
            // again, once, on a fresh one.
            auto c = ConnectionFor(who);
            return answer((*c).whole(), r);
          }
        };
        std::string key = who.role + '\x1f' + view + '\x1f' + r.id;
        for (const auto& [k, v] : r.params) key += '\x1f' + k + '=' + v;
        SharedAnswers::Answer answer;
        if (std::string after = req.get_param_value("after"); !after.empty()) {
          // "latest": an answer that shows every change settled when the request came.
          static const std::regex digits("[0-9]{1,18}");
          bool latest = after == "latest";
          if (!latest && !std::regex_match(after, digits))
            throw UserError("after=" + after + ": expected an event id or latest");
          int64_t wanted = latest ? hub_.Latest() : std::stoll(after);
          answer = shared_.Get(key, wanted, latest, read);
          res.set_header("X-Trnflow-Change", std::to_string(answer.change));
          if (latest) res.set_header("X-Trnflow-Latest", std::to_string(wanted));
        } else {
          answer = shared_.ReadAndKeep(key, read);
        }
        auto& body = answer.body;
        if (!body) throw HttpError(404, "not found (or not yours to see)");
        res.set_header("Cache-Control", "no-store");
        res.set_content(*body + "\n", "application/json");
      });
    });
  }

  void Routes(httplib::Server& svr) {
    svr.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_redirect("/runs");
    });
    svr.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok\n", "text/plain");
    });
    // Every page is the same shell; assets/app.js draws the one the path names.
    auto page = [this](const httplib::Request& req, httplib::Response& res) {
      Guarded(res, [&] {
        Identify(req);
        const EmbeddedFile* f = Asset("index.html");
        res.set_content(std::string(f->text), "text/html; charset=utf-8");
      });
    };
    for (const char* p : {"/runs", R"(/runs/(\d+))", "/spend", "/cache", "/schedules", "/workers"})
      svr.Get(p, page);
    svr.Get(R"(/assets/([a-z0-9_.-]+))", [](const httplib::Request& req, httplib::Response& res) {
      SecurityHeaders(res);
      const EmbeddedFile* f = Asset(req.matches[1]);
      if (!f || std::string(req.matches[1]) == "index.html") {
        res.status = 404;
        res.set_content("not found\n", "text/plain");
        return;
      }
      res.set_header("Cache-Control", "no-cache");
      res.set_content(std::string(f->text), ContentType(f->name.data()).c_str());
    });
    Api(svr, "/api/runs", "runs");
    Api(svr, R"(/api/runs/(\d+))", "run");
    Api(svr, "/api/spend", "spend");
    Api(svr, "/api/cache", "cache");
    Api(svr, "/api/schedules", "schedules");
    Api(svr, "/api/workers", "workers");
    Api(svr, R"(/api/runs/(\d+)/log)", "log");
    Api(svr, "/api/budgets", "budgets");
    Api(svr, "/api/savings", "savings");
    // GET /api/log-ticket?offset=BYTES with X-Trnflow-Log-Ticket: a piece of one attempt's log
    // for a member's `trnflow logs` (docs/serve.md, "Logs from the command line"). The ticket
    // (trnflow.log_ticket, issued to the member's own login after checking they read the run's
    // project) is spent here, once; the log is then read as the "log" view reads it for the
    // dashboard, acting as that member, so row-level security decides once more.
    svr.Get("/api/log-ticket", [this](const httplib::Request& req, httplib::Response& res) {
      Guarded(res, [&] {
        res.set_header("Cache-Control", "no-store");
        auto view = o_.views.find("log");
        if (view == o_.views.end()) throw HttpError(404, "no such resource");
        std::string ticket = req.get_header_value("X-Trnflow-Log-Ticket");
        if (ticket.empty())
          throw HttpError(401, "no X-Trnflow-Log-Ticket header: `trnflow logs` gets one from "
                               "the catalog with the member's own login");
        auto c = pool_.Take();
        auto spent = (*c)->SpendLogTicket(ticket);
        if (!spent)
          throw HttpError(403, "the log ticket is unknown, already used or expired (one "
                               "request, within 60 s of `trnflow logs` asking for it)");
        if ((*c)->MemberProjects(spent->member).empty())
          throw HttpError(403, "'" + spent->member + "' is not a project member the dashboard "
                               "may act as (`trnflow project grant PROJECT ROLE --read` makes "
                               "one)");
        (*c)->ActAs(spent->member);
        ApiRequest r;
        r.id = std::to_string(spent->run_id);
        r.params["stage"] = spent->stage;
        r.params["attempt"] = std::to_string(spent->attempt);
        if (std::string offset = req.get_param_value("offset"); !offset.empty())
          r.params["offset"] = offset;
        auto body = view->second((*c).whole(), r);
        if (!body) throw HttpError(404, "not found (or not yours to see)");
        res.set_content(*body + "\n", "application/json");
      });
    });
    svr.Get("/api/me", [this](const httplib::Request& req, httplib::Response& res) {
      Guarded(res, [&] {
        Who who = Identify(req);
        nlohmann::json j = {{"role", who.role.empty() ? nlohmann::json(nullptr)
                                                      : nlohmann::json(who.role)},
                            {"auth", o_.auth == Auth::kLocal ? "local" : "proxy"},
                            {"projects", who.all ? nlohmann::json(nullptr)
                                                 : nlohmann::json(who.projects)},
                            {"csrf_token", CsrfToken(who)}};
        res.set_header("Cache-Control", "no-store");
        res.set_content(j.dump() + "\n", "application/json");
      });
    });
    // Prometheus. Without a user (--auth local, or --auth proxy with no user header: the
    // monitoring system) it counts everything the daemons' login sees; a request the proxy
    // names a user in is computed as that user, so row-level security limits what it counts.
    svr.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
      Guarded(res, [&] {
        Who who;
        if (o_.auth == Auth::kProxy && !req.get_header_value(o_.user_header.c_str()).empty())
          who = Identify(req);
        auto c = ConnectionFor(who);
        auto rows = (*c)->Metrics();
        if (o_.metrics)
          for (auto& r : o_.metrics((*c).whole())) rows.push_back(std::move(r));
        rows.push_back({"trnflow_serve_event_clients", "{}", static_cast<double>(hub_.clients())});
        res.set_content(FormatMetrics(rows), "text/plain; version=0.0.4; charset=utf-8");
      });
    });
    svr.Get("/api/events", [this](const httplib::Request& req, httplib::Response& res) {
      Events(req, res);
    });
    svr.Post(R"(/api/runs/(\d+)/(cancel|resume|retry))",
             [this](const httplib::Request& req, httplib::Response& res) { Write(req, res); });
  }

  // Server-Sent Events: the state changes this request's role may see, from the id in
  // Last-Event-ID (or ?last_event_id=) on, else from now; a comment line when idle.
  void Events(const httplib::Request& req, httplib::Response& res) {
    Guarded(res, [&] {
      auto who = std::make_shared<Who>(Identify(req));
      std::string last = req.get_header_value("Last-Event-ID");
      if (last.empty() && req.has_param("last_event_id")) last = req.get_param_value("last_event_id");
      int64_t after = hub_.Latest();
      bool resume = false;
      if (!last.empty()) {
        static const std::regex digits("[0-9]{1,18}");
        if (!std::regex_match(last, digits))
          throw UserError("Last-Event-ID " + last + ": expected an event id");
        after = std::stoll(last);
        resume = true;
      }
      if (!hub_.TryAddClient(o_.max_clients))
        throw HttpError(503, "too many event streams (" + std::to_string(o_.max_clients) +
                             "); poll /api/runs/ID instead, or raise --max-clients");
      res.set_header("Cache-Control", "no-store");
      res.set_header("X-Accel-Buffering", "no");
      auto state = std::make_shared<int64_t>(after);
      auto first = std::make_shared<bool>(true);
      auto ends = std::chrono::steady_clock::now() +
                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(o_.stream_lifetime_s));
      res.set_chunked_content_provider(
          "text/event-stream",
          [this, who, state, first, resume, ends](size_t, httplib::DataSink& sink) {
            std::string out;
            auto visible = [&](const schema::ChangeRow& c) {
              return who->all || who->projects.count(c.project) > 0;
            };
            int64_t before = *state, written = *state;
            auto add_one = [&](const schema::ChangeRow& c, const std::string* event) {
              if (c.id <= *state) return;
              if (visible(c)) out += event ? *event : ChangeEvent(c), written = c.id;
              *state = c.id;
            };
            auto add = [&](const std::vector<schema::ChangeRow>& rows) {
              for (const auto& c : rows) add_one(c, nullptr);
            };
            auto add_held = [&](const std::vector<std::shared_ptr<const HeldChange>>& held) {
              for (const auto& h : held) add_one(h->row, &h->event);
            };
            if (*first) {
              *first = false;
              out = "retry: 2000\n: trnflow event stream\n\n";
              if (resume) add(FromCatalog(*state));
              if (!sink.write(out.data(), out.size())) return false;
              out.clear();
              before = written = *state;
            }
            if (hub_.stopped()) return false;
            auto now = std::chrono::steady_clock::now();
            if (now >= ends) {
              sink.done();  // the client reconnects with Last-Event-ID
              return true;
            }
            double wait = std::min(o_.heartbeat_s, std::chrono::duration<double>(ends - now).count());
            auto batch = hub_.Wait(*state, wait);
            if (hub_.stopped()) return false;
            if (batch.gap) {
              // Behind what the hub holds: the catalog gives what follows, a page per call. A
              // full page may leave more between it and the hub's oldest change; the hub's
              // batch waits for the next call then, so nothing in between is skipped.
              bool full = false;
              add(FromCatalog(*state, &full));
              if (!full) add_held(batch.changes);
            } else {
              add_held(batch.changes);
            }
            // Changes of projects it may not see move its resume point past them too.
            if (*state != before && written != *state) out += "id: " + std::to_string(*state) + "\n\n";
            if (out.empty()) out = ": heartbeat\n\n";
            return sink.write(out.data(), out.size());
          },
          [this](bool) { hub_.RemoveClient(); });
    });
  }

  // Changes after `after` from the catalog itself (a resume, or a stream that fell behind).
  static constexpr size_t kCatchUpPage = 10000;
  // Never past what the hub has settled: a later id may be followed by an earlier one still
  // to commit (event_hub.h), which a stream that went past it would never get.
  std::vector<schema::ChangeRow> FromCatalog(int64_t after, bool* full = nullptr) {
    int64_t settled = hub_.Latest();
    auto c = pool_.Take();
    auto rows = (*c)->ChangesSince(after, static_cast<int>(kCatchUpPage));
    if (full) *full = rows.size() == kCatchUpPage;
    while (!rows.empty() && rows.back().id > settled) rows.pop_back();
    return rows;
  }

  // The token a write must carry (X-CSRF-Token): bound to the user and to this process, read
  // from /api/me, which another site's page cannot read (no CORS), and sent in a header, which
  // another site's form cannot set.
  std::string CsrfToken(const Who& who) const {
    return Sha256Hex(csrf_secret_ + "\n" + who.role);
  }

  // POST /api/runs/ID/cancel|resume|retry?stage=NAME: as the person, who must see the run and
  // be a writer of its project (any request with --auth local: the operator on this host).
  void Write(const httplib::Request& req, httplib::Response& res) {
    Guarded(res, [&] {
      Who who = Identify(req);
      if (req.get_header_value("X-CSRF-Token") != CsrfToken(who))
        throw HttpError(403, "missing or wrong X-CSRF-Token (read it from /api/me)");
      int64_t run_id = std::stoll(std::string(req.matches[1]));
      std::string action = req.matches[2];
      std::string project;
      {
        auto c = ConnectionFor(who);
        auto run = (*c)->GetRun(run_id);
        if (!run) throw HttpError(404, "not found (or not yours to see)");
        project = run->project;
      }
      if (!who.role.empty()) {
        auto c = pool_.Take();
        if (!(*c)->MayWrite(who.role, project))
          throw HttpError(403, "'" + who.role + "' may read project " + project +
                               " but not write it (`trnflow project grant " + project + " " +
                               who.role + " --write`)");
      }
      // The catalog's functions check the login (the daemons'): the person was checked above.
      auto c = pool_.Take();
      nlohmann::json out = {{"run_id", std::to_string(run_id)}, {"action", action}};
      if (action == "cancel") {
        auto r = (*c)->CancelRun(run_id);
        out["cancelled"] = r.cancelled;
        out["stages_cancelled"] = r.stages_cancelled;
      } else if (action == "resume") {
        out["stages_reset"] = (*c)->ResumeRun(run_id);
      } else {
        std::string stage = req.get_param_value("stage");
        if (stage.empty()) throw UserError("retry needs ?stage=NAME");
        out["stages_reset"] = (*c)->RetryStage(run_id, stage);
      }
      Logger("serve")->info("{} run={} by={}", action, run_id,
                            who.role.empty() ? "local" : who.role);
      res.set_content(out.dump() + "\n", "application/json");
    });
  }

  const Options& o_;
  CatalogPool pool_;
  EventHub hub_;
  SharedAnswers shared_;
  std::string csrf_secret_;
  std::string secret_;  // the token (--auth local) or the proxy's secret; set before listening
  std::vector<std::string> allowed_hosts_;  // set before listening
  std::string cookie_name_;                 // set before listening
};

}  // namespace

bool IsLoopback(const std::string& host) {
  std::string h = host;
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  std::transform(h.begin(), h.end(), h.begin(), [](unsigned char c) { return std::tolower(c); });
  if (h == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, h.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

namespace {
std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}
}  // namespace

bool HostAllowed(const std::string& host_header, const std::vector<std::string>& allowed) {
  std::string name = host_header, port;
  if (!name.empty() && name[0] == '[') {
    size_t close = name.find(']');
    if (close == std::string::npos) return false;
    port = name.substr(close + 1);
    name = name.substr(0, close + 1);
    if (!port.empty() && port[0] != ':') return false;
  } else if (size_t colon = name.find(':'); colon != std::string::npos) {
    port = name.substr(colon);
    name = name.substr(0, colon);
  }
  if (!port.empty()) {
    port = port.substr(1);
    if (port.empty() || port.size() > 5 ||
        !std::all_of(port.begin(), port.end(), [](unsigned char c) { return std::isdigit(c); }))
      return false;
  }
  if (name.empty()) return false;
  name = Lower(name);
  return std::any_of(allowed.begin(), allowed.end(),
                     [&](const std::string& a) { return Lower(a) == name; });
}

std::vector<std::string> AllowedHosts(const std::string& listen_host,
                                      const std::vector<std::string>& extra) {
  std::vector<std::string> out;
  auto add = [&](std::string h) {
    if (h.find(':') != std::string::npos && h.front() != '[') h = "[" + h + "]";
    if (!h.empty() && std::find(out.begin(), out.end(), Lower(h)) == out.end())
      out.push_back(Lower(h));
  };
  if (listen_host != "0.0.0.0" && listen_host != "::" && !listen_host.empty()) add(listen_host);
  if (IsLoopback(listen_host)) add("localhost");
  for (const auto& h : extra) add(h);
  return out;
}

std::string LoadOrCreateSecret(const std::string& path, const std::string& what) {
  auto fail = [&](const std::string& why) {
    return UserError(what + " " + path + ": " + why);
  };
  if (path.empty()) throw UserError(what + ": no file given");
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) {
    std::string secret = schema::RandomSecret() + schema::RandomSecret();
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST) return LoadOrCreateSecret(path, what);  // made meanwhile
    if (fd < 0)
      throw fail(std::string("cannot create it (") + std::strerror(errno) +
                 "); give a file this user may write with " + what);
    std::string line = secret + "\n";
    bool ok = ::fchmod(fd, 0600) == 0 &&
              ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
    ::close(fd);
    if (!ok) throw fail(std::string("cannot write it (") + std::strerror(errno) + ")");
    Logger("serve")->info("made a new secret in {} (mode 0600)", path);
    return secret;
  }
  if (fd < 0)
    throw fail(std::string("cannot open it (") + std::strerror(errno) + ")");
  struct stat st {};
  std::string text;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() &&
      (st.st_mode & 0027) == 0) {
    char buf[512];
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) text.assign(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  if (!S_ISREG(st.st_mode)) throw fail("not a regular file");
  if (st.st_uid != ::geteuid())
    throw fail("owned by uid " + std::to_string(st.st_uid) + ", not this user (uid " +
               std::to_string(::geteuid()) + "): chown it to the user the dashboard runs as");
  if ((st.st_mode & 0027) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    throw fail(std::string("mode ") + mode + " lets others read it or its group write it; "
               "chmod 600 " + path);
  }
  text = text.substr(0, text.find('\n'));
  while (!text.empty() && (text.back() == '\r' || text.back() == ' ')) text.pop_back();
  if (text.size() < 16) throw fail("holds fewer than 16 characters; delete it to have one made");
  return text;
}

void ParseListen(const std::string& text, Options& o) {
  if (text.rfind("unix:", 0) == 0) {
    std::string path = text.substr(5);
    if (path.empty() || path[0] != '/' || path.size() > 100)
      throw UserError("--listen " + text + ": expected unix:/absolute/path (at most 100 bytes)");
    o.unix_path = path;
    o.host = "127.0.0.1";
    o.port = 0;
    return;
  }
  o.unix_path.clear();
  static const std::regex re(R"(^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]*):([0-9]{1,5})$)");
  std::smatch m;
  if (!std::regex_match(text, m, re) || std::stoi(m[2]) > 65535)
    throw UserError("--listen " + text + ": expected HOST:PORT, e.g. 127.0.0.1:8080 (port 0: any)");
  std::string host = m[1];
  if (host.size() > 1 && host[0] == '[') host = host.substr(1, host.size() - 2);
  o.host = host.empty() ? "0.0.0.0" : host;
  o.port = std::stoi(m[2]);
}

void Serve(const Options& options, const std::atomic<bool>& stop,
           const std::function<void(int port)>& on_listening) {
  Dashboard d(options);
  d.Run(stop, on_listening);
}

}  // namespace trnflow::serve
