#pragma once
// Pipelines of no-op stages for the DAG and submit benchmarks, as YAML text.
#include <string>

namespace trnflow::bench {

// "fan": one root, STAGES-2 stages that need it (a matrix), one sink that needs them all.
// "chains": CHAINS chains of STAGES/CHAINS stages, each needing the one before it.
inline std::string DagYaml(const std::string& shape, int stages, int chains = 100) {
  std::string y = "pipeline: bench-" + shape + "\nproject: bench\nstages:\n";
  if (shape == "fan") {
    y += "  root:\n    run: [\"true\"]\n  mid:\n    needs: [root]\n    run: [\"true\"]\n";
    y += "    matrix:\n      i: [";
    for (int i = 1; i <= stages - 2; ++i) y += (i > 1 ? "," : "") + std::to_string(i);
    y += "]\n  sink:\n    needs: [mid]\n    run: [\"true\"]\n";
    return y;
  }
  int length = stages / chains;
  for (int c = 0; c < chains; ++c)
    for (int k = 0; k < length; ++k) {
      y += "  c" + std::to_string(c) + "-" + std::to_string(k) + ":\n    run: [\"true\"]\n";
      if (k > 0) y += "    needs: [c" + std::to_string(c) + "-" + std::to_string(k - 1) + "]\n";
    }
  return y;
}

// Dependency edges of DagYaml(shape, stages).
inline int DagEdges(const std::string& shape, int stages, int chains = 100) {
  return shape == "fan" ? 2 * (stages - 2) : chains * (stages / chains - 1);
}

}  // namespace trnflow::bench
