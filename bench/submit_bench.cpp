// submit_bench: a 10,000-stage pipeline (100 chains of 100) from file to committed, as
// `trnflow submit FILE` does it (a real process: parse, validate, plan for budget admission,
// one transaction), timed from spawn to exit; then the same steps in this process, timed
// apart, to show where the time goes.
// Usage: submit_bench --trnflow PATH [--stages 10000]
// Prints one JSON line on stdout; needs TRNFLOW_TEST_ADMIN_URL or the local PostgreSQL.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "bench/bench_util.h"
#include "bench/dag_gen.h"
#include "pipelines/pipeline.h"
#include "pipelines/plan.h"
#include "sim/catalog.h"

extern char** environ;

using namespace trnflow;
using namespace trnflow::bench;

int main(int argc, char** argv) {
  Flags flags(argc, argv);
  std::string trnflow_bin = flags.Text("trnflow", "build/trnflow");
  int stages = static_cast<int>(flags.Int("stages", 10000));
  std::string name = "trnflow_bench_submit_" + std::to_string(getpid());
  std::string url = schema::CreateDatabase(AdminUrl(), name);
  std::string file = "/tmp/trnflow-submit-" + std::to_string(getpid()) + ".yaml";
  std::ofstream(file) << DagYaml("chains", stages);
  double cli_s = 0, parse_s = 0, plan_s = 0, insert_s = 0;
  {
    schema::Catalog c(url);
    PrepareBenchCatalog(c);
    // The command, as a user runs it.
    std::string env_url = "TRNFLOW_DATABASE_URL=" + url;
    std::vector<char*> envp;
    for (char** e = environ; *e; ++e)
      if (std::string(*e).rfind("TRNFLOW_DATABASE_URL=", 0) != 0) envp.push_back(*e);
    envp.push_back(env_url.data());
    envp.push_back(nullptr);
    std::string sub = "submit", quiet_file = file;
    char* args[] = {trnflow_bin.data(), sub.data(), quiet_file.data(), nullptr};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    auto t0 = Clock::now();
    pid_t pid;
    if (posix_spawn(&pid, trnflow_bin.c_str(), &fa, nullptr, args, envp.data()) != 0) {
      std::fprintf(stderr, "submit_bench: cannot run %s\n", trnflow_bin.c_str());
      return 1;
    }
    int status = 0;
    waitpid(pid, &status, 0);
    cli_s = Ms(Clock::now() - t0) / 1000;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "submit_bench: trnflow submit failed (status %d)\n", status);
      return 1;
    }
    std::string count = schema::testing::QueryValue(c, "SELECT count(*) FROM trnflow.stages");
    if (std::stoi(count) != stages) {
      std::fprintf(stderr, "submit_bench: %s stages committed, not %d\n", count.c_str(), stages);
      return 1;
    }
    // The same steps in-process, each timed.
    t0 = Clock::now();
    auto loaded = pipelines::LoadPipelineFile(file, {});
    parse_s = Ms(Clock::now() - t0) / 1000;
    t0 = Clock::now();
    auto plan = pipelines::MakePlan(*loaded.pipeline);
    plan_s = Ms(Clock::now() - t0) / 1000;
    schema::SubmitOptions opts;
    opts.workdir = "/tmp";
    t0 = Clock::now();
    c.SubmitRun(*loaded.pipeline, opts);
    insert_s = Ms(Clock::now() - t0) / 1000;
  }
  std::remove(file.c_str());
  DropBenchDatabase(name);
  std::printf(
      "{\"system\":\"trnflow\",\"workload\":\"submit\",\"jobs\":%d,\"seconds\":%.3f,"
      "\"per_s\":%.0f,\"parse_validate_s\":%.3f,\"plan_s\":%.3f,\"insert_s\":%.3f}\n",
      stages, cli_s, stages / cli_s, parse_s, plan_s, insert_s);
  return 0;
}
