// SPDX-License-Identifier: MIT
// Finding and running the Python report scripts (scripts/report/) from the atlas binary:
// `atlas report` runs atlas_report.py on a run directory, and `atlas schedule --png` can run it
// on a schedule JSON file. Not for anything on the training path (it forks a process).
#pragma once

#include <string>
#include <vector>

namespace atlas::app {

/// Absolute path of scripts/report/`name`. Looks in $ATLAS_ROOT/scripts/report, then in each
/// core::data_dirs() entry (<bin>/../share/atlas/scripts/report: the installed copy, or in a
/// build tree a link to the checkout's). Throws atlas::Error (Io) naming every place tried.
/// Local; no MPI.
[[nodiscard]] std::string find_report_script(const std::string& name);

/// The Python that runs the scripts: $ATLAS_PYTHON, else /usr/bin/python3 (Debian's, which sees
/// python3-h5py and python3-matplotlib; the first python3 on PATH may be a pyenv build that
/// does not). Throws atlas::Error (Io) with the packages to install when it is not executable.
[[nodiscard]] std::string report_python();

/// Runs `report_python() script args...` with this process's environment and stdio, waits for it
/// and returns its exit status (128 + N if it was killed by signal N). Throws atlas::Error (Io)
/// if it cannot be started. Call on one rank only: it forks.
int run_report_script(const std::string& script, const std::vector<std::string>& args);

}  // namespace atlas::app
