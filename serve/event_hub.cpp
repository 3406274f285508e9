#include "serve/event_hub.h"

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <variant>

#include "common/error.h"
#include "common/log.h"
#include "schema/serve_catalog.h"

namespace trnflow::serve {

std::string ChangeEvent(const schema::ChangeRow& c) {
  nlohmann::json j = {
      {"id", std::to_string(c.id)},
      {"at", c.at},
      {"project", c.project},
      {"run_id", std::to_string(c.run_id)},
      {"stage", c.stage.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.stage)},
      {"state", std::visit([](auto s) { return schema::ToSql(s); }, c.state)}};
  return "id: " + std::to_string(c.id) + "\nevent: change\ndata: " + j.dump() + "\n\n";
}

EventHub::EventHub(std::string database_url, size_t keep)
    : url_(std::move(database_url)), keep_(keep) {}

EventHub::~EventHub() { Stop(); }

void EventHub::Start() {
  {
    auto c = schema::OpenServeCatalog(url_);
    std::scoped_lock lock(mu_);
    latest_ = c->LatestChangeId();
  }
  thread_ = std::thread([this] { Loop(); });
}

void EventHub::Stop() {
  stop_ = true;
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

int64_t EventHub::Latest() const {
  std::scoped_lock lock(mu_);
  return latest_;
}

bool EventHub::TryAddClient(int max) {
  int n = clients_.load();
  while (n < max)
    if (clients_.compare_exchange_weak(n, n + 1)) return true;
  return false;
}

void EventHub::RemoveClient() { --clients_; }

EventHub::Batch EventHub::Wait(int64_t after, double timeout_s) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
               [&] { return stop_ || latest_ > after; });
  Batch b;
  if (latest_ <= after) return b;
  // What follows `after` is older than anything held (or an id was skipped by a rolled-back
  // transaction: then the catalog gives the same answer, one read later).
  b.gap = recent_.empty() || recent_.front()->row.id > after + 1;
  auto from = std::upper_bound(recent_.begin(), recent_.end(), after,
                               [](int64_t id, const auto& c) { return id < c->row.id; });
  b.changes.assign(from, recent_.end());
  return b;
}

void EventHub::Loop() {
  auto log = Logger("serve.events");
  std::unique_ptr<schema::ServeCatalog> c;
  auto last_poll = std::chrono::steady_clock::now() - std::chrono::hours(1);
  auto last_prune = std::chrono::steady_clock::now() - std::chrono::hours(2);
  while (!stop_) {
    try {
      if (!c) {
        c = schema::OpenServeCatalog(url_);
        c->ListenForChanges();
        last_poll = std::chrono::steady_clock::now() - std::chrono::hours(1);
      }
      bool holding = hole_at_ != 0;
      auto n = c->AwaitNotifications(holding ? 50 : 500);
      auto now = std::chrono::steady_clock::now();
      // The feed keeps a week: enough to resume any stream, never growing without end.
      if (now - last_prune > std::chrono::hours(1)) {
        last_prune = now;
        if (int64_t gone = c->PruneChanges(7 * 86400.0)) log->info("pruned {} old changes", gone);
      }
      // A notification says there is something new; every 2 s the hub looks anyway, in case
      // one was lost with a connection.
      if (n.changes == 0 && !holding && now - last_poll < std::chrono::seconds(2)) continue;
      last_poll = now;
      int64_t after = Latest();
      while (!stop_) {
        // The horizon before the read: if every transaction that could hold a hole had ended
        // by then, the read sees whatever they committed.
        int64_t oldest = c->OldestRunningTransaction();
        auto rows = c->ChangesSince(after, 1000);
        std::vector<schema::ChangeRow> settled;
        bool stuck = false;
        for (auto& r : rows) {
          if (r.id != after + 1) {
            if (hole_at_ != after + 1) {
              // A new hole. Whoever holds it took the id in the transaction that wrote the
              // stage or run row (the triggers of 0013), so it already had a transaction id,
              // older than one taken now: once every transaction older than that has ended,
              // the hole is for good.
              hole_at_ = after + 1;
              hole_horizon_ = c->NewTransactionId();
              hole_since_ = std::chrono::steady_clock::now();
              stuck = true;
              break;
            }
            if (oldest < hole_horizon_) {
              // Its transaction may still commit: wait for it, though not for ever (an
              // unrelated transaction that runs for minutes holds the horizon back as well).
              if (std::chrono::steady_clock::now() - hole_since_ < std::chrono::seconds(30)) {
                stuck = true;
                break;
              }
              log->warn("passing over change ids {}..{} after 30 s: a transaction older than "
                        "them is still open", after + 1, r.id - 1);
            }
            // Every transaction that could have held the ids up to r.id has ended without
            // them: rolled back. Never to come.
            log->debug("change ids {}..{} were rolled back", after + 1, r.id - 1);
          }
          hole_at_ = 0;
          after = r.id;
          settled.push_back(std::move(r));
        }
        if (!stuck) hole_at_ = 0;
        if (!settled.empty()) {
          std::vector<std::shared_ptr<const HeldChange>> held;
          for (auto& r : settled) {
            std::string event = ChangeEvent(r);
            held.push_back(std::make_shared<const HeldChange>(HeldChange{std::move(r), std::move(event)}));
          }
          std::scoped_lock lock(mu_);
          recent_.insert(recent_.end(), held.begin(), held.end());
          while (recent_.size() > keep_) recent_.pop_front();
          latest_ = after;
        }
        if (!settled.empty()) cv_.notify_all();
        if (stuck || static_cast<int>(rows.size()) < 1000) break;
      }
    } catch (const CatalogUnavailable& e) {
      log->warn("event stream: {}; reconnecting", e.what());
      c.reset();
      for (int i = 0; i < 20 && !stop_; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    } catch (const std::exception& e) {
      log->error("event stream: {}", e.what());
      c.reset();
      for (int i = 0; i < 20 && !stop_; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
}

}  // namespace trnflow::serve
