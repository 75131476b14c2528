// The stop flag behind core/stop.h.
#include "hymoe/core/stop.h"

#include <csignal>
#include <initializer_list>

namespace hymoe {

namespace {

volatile std::sig_atomic_t requested = 0;

extern "C" void on_stop_signal(int sig) {
    if (sig == SIGINT && requested == SIGINT) {  // a second Ctrl-C: stop now
        std::signal(SIGINT, SIG_DFL);
        std::raise(SIGINT);
    }
    requested = sig;
}

}  // namespace

StopSignals::StopSignals() {
    for (int sig : {SIGUSR1, SIGTERM, SIGINT})
        std::signal(sig, on_stop_signal);
}

StopSignals::~StopSignals() {
    for (int sig : {SIGUSR1, SIGTERM, SIGINT})
        std::signal(sig, SIG_DFL);
}

int stop_signal() {
    return requested;
}

const char* signal_name(int sig) {
    switch (sig) {
        case SIGUSR1:
            return "SIGUSR1";
        case SIGTERM:
            return "SIGTERM";
        case SIGINT:
            return "SIGINT";
        default:
            return "a signal";
    }
}

}  // namespace hymoe
