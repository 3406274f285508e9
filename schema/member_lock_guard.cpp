#include "schema/member_lock_guard.h"

#include <chrono>
#include <memory>

#include "common/error.h"
#include "common/log.h"
#include "schema/catalog.h"

namespace trnflow::schema {

MemberLockGuard::MemberLockGuard(std::string database_url, double limit_s, double every_s,
                                 std::function<bool()> active)
    : url_(std::move(database_url)), limit_s_(limit_s), every_s_(every_s),
      active_(std::move(active)) {}

MemberLockGuard::~MemberLockGuard() { Stop(); }

void MemberLockGuard::Start() {
  if (limit_s_ <= 0 || thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] { Loop(); });
}

void MemberLockGuard::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void MemberLockGuard::Loop() {
  using Steady = std::chrono::steady_clock;
  auto log = Logger("locks");
  std::unique_ptr<Catalog> catalog;
  while (!stop_) {
    try {
      if (!active_ || active_()) {
        if (!catalog) catalog = std::make_unique<Catalog>(url_);
        for (const auto& ended : catalog->EndMemberBlockers(limit_s_))
          log->warn("ended a member's session that blocked the daemons: {}", ended);
      }
    } catch (const CatalogUnavailable& e) {
      catalog.reset();
      log->debug("{}", e.what());
    } catch (const std::exception& e) {
      log->error("tick failed: {}", e.what());
    }
    auto until = Steady::now() + std::chrono::duration_cast<Steady::duration>(
                                     std::chrono::duration<double>(every_s_));
    while (!stop_ && Steady::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace trnflow::schema
