// Clean stops: SIGUSR1 (Slurm's --signal warning), SIGTERM (scancel, preemption) and SIGINT set a
// flag that long jobs poll at their safe points (the engine between steps); they then save what
// they have and exit with Exit::stopped (75), and a rerun resumes. The handler only stores the
// signal number, so it is async-signal-safe; a second SIGINT still ends the process at once.
#pragma once

namespace hymoe {

// The handlers, installed for the scope's lifetime (a job's run); the defaults come back after, so
// everything else (plans, --check, loading) still ends at once on SIGTERM or Ctrl-C.
class StopSignals {
public:
    StopSignals();
    ~StopSignals();
    StopSignals(const StopSignals&) = delete;
    StopSignals& operator=(const StopSignals&) = delete;
};
// The signal that asked for a stop, 0 when none has.
int stop_signal();
// "SIGUSR1", "SIGTERM", "SIGINT" or "a signal".
const char* signal_name(int sig);

}  // namespace hymoe
