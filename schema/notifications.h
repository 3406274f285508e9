#pragma once
// What arrived on a catalog connection's LISTEN channels while it waited
// (AwaitNotifications in worker_catalog.h and serve_catalog.h). Plain data.

namespace trnflow::schema {

struct Notifications {
  int ready = 0;    // ListenForReadyStages: stages became ready
  int cancel = 0;   // ListenForReadyStages: runs were cancelled
  int changes = 0;  // ListenForChanges: new rows in trnflow.changes
};

}  // namespace trnflow::schema
