#pragma once
// Where trnflow keeps a run's files under TRNFLOW_HOME (after LevelDB's filename.h): the one
// place their names are made. The worker writes an attempt's log and checkpoints there, the
// sandbox and the Slurm executor name an attempt's directories after it, and `trnflow logs`
// and the dashboard's log tail find the log by the same functions. Pure string work; no I/O.
//
//   HOME/runs/RUN/                              ${{ run.dir }}, the run's working tree
//   HOME/logs/run-RUN/STAGE.attempt-N.log       an attempt's captured output
//   HOME/checkpoints/run-RUN/STAGE/             TRNFLOW_CHECKPOINT_DIR, kept across attempts
//
// STAGE is SafeName(the stage's name).
#include <cstdint>
#include <string>
#include <string_view>

namespace trnflow {

// A stage name as one path component (logs, checkpoints, attempts): '/', ' ' and control
// characters become '_', and a name that is empty, "." or ".." gets a leading '_', so it
// never names its parent or itself.
std::string SafeName(std::string s);

// "run-RUN": a run's directory among the logs and checkpoints of every run.
std::string RunDirName(int64_t run_id);
// "STAGE.attempt-N": an attempt's name (its log, its private home, its Slurm directory).
std::string AttemptName(std::string_view stage, int attempt);

// HOME/runs/RUN
std::string RunDir(std::string_view home, int64_t run_id);
// HOME/logs/run-RUN
std::string RunLogDir(std::string_view home, int64_t run_id);
// HOME/logs/run-RUN/STAGE.attempt-N.log
std::string AttemptLogPath(std::string_view home, int64_t run_id, std::string_view stage,
                           int attempt);
// HOME/checkpoints/run-RUN/STAGE
std::string CheckpointDir(std::string_view home, int64_t run_id, std::string_view stage);

}  // namespace trnflow
