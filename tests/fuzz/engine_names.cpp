// runtime::to_string(Finish) for the fuzz build: the one function of runtime/engine.cpp the
// results journal calls; engine.cpp itself (the whole inference engine) is not built for fuzzing.
#include "hymoe/runtime/engine.h"

namespace hymoe::runtime {

const char* to_string(Finish f) {
    return f == Finish::stop ? "stop" : "length";
}

}  // namespace hymoe::runtime
