// Clean stops: SIGUSR1 (Slurm's --signal warning), SIGTERM (scancel, preemption) and SIGINT set a
// flag that long jobs poll at their safe points (the engine between steps); they then save what
// they have and exit with Exit::stopped (75), and a rerun resumes. The handler only stores the
// signal number, so it is async-signal-safe; a second SIGINT still ends the process at once.
#pragma once

namespace hymoe {

// Installs the handlers (once per process).
void install_stop_handlers();
// The signal that asked for a stop, 0 when none has.
int stop_signal();
// "SIGUSR1", "SIGTERM", "SIGINT" or "signal N".
const char* signal_name(int sig);

}  // namespace hymoe
