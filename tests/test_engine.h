#pragma once
// Options for running the engine inside a test process against TestDatabase: short leases,
// fast ticks, a private TRNFLOW_HOME, and pipelines parsed from inline YAML.
#include <cstdint>
#include <string>
#include <vector>

#include "pipelines/pipeline.h"
#include "scheduler/scheduler.h"
#include "schema/catalog.h"
#include "workers/worker.h"

namespace trnflow::testing {

// Parses inline YAML; fails the test (and returns an empty pipeline) on a diagnostic.
pipelines::Pipeline MustParse(const std::string& yaml, const std::string& project = "");
// TRNFLOW_HOME for this test process (created on first use).
std::string TestHome();
workers::WorkerOptions TestWorkerOptions(std::vector<workers::PoolConfig> pools);
scheduler::SchedulerOptions TestSchedulerOptions();
// Simulated time at `speed`, seed 1, commands started in the source tree.
schema::SubmitOptions FastSubmit(double speed = 1e7);

// A small pipeline of every kind of stage with a cost (a command, spot training with
// checkpoints, a compile fanned out over a matrix) in project "lab": for the ledger's reports.
extern const char* const kSmallPipeline;
// Submits `p` at `speed` and runs it to its end with a scheduler and a worker (trn1=4, cpu=2)
// in this process; returns the run's id.
int64_t RunToEnd(schema::Catalog& c, const pipelines::Pipeline& p, double speed = 1e6);

}  // namespace trnflow::testing
