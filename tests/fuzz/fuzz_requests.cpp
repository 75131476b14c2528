// Fuzz target: a JSONL request file read line by line (io/requests.h), as an infer job with
// inference.on_bad_request: skip does: a bad line is one hymoe::Error and the next line is read.
#include "fuzz.h"
#include "hymoe/io/requests.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = hymoe::fuzz::write_file("requests.jsonl", data, size);
    return hymoe::fuzz::guarded([&] {
        hymoe::io::count_requests(path);
        auto reader = hymoe::io::open_requests(path);
        hymoe::io::Request r;
        for (int lines = 0; lines < 10000; ++lines) {
            try {
                if (!reader->next(r))
                    break;
            } catch (const hymoe::Error&) {  // skipped, as on_bad_request: skip
            }
        }
    });
}
