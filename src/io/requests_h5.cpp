// The HDF5 token-dataset request reader (see io/requests.h): /tokens, /offsets and the optional
// /max_new_tokens, read a window of requests at a time.
#include <algorithm>
#include <filesystem>

#include "hymoe/core/error.h"
#include "hymoe/io/h5.h"
#include "hymoe/io/requests.h"

namespace hymoe::io {

namespace {

class H5Requests : public RequestReader {
public:
    explicit H5Requests(const std::string& path) : path_(path), file_(open(path)) {
        for (const char* name : {"/tokens", "/offsets"})
            if (!file_.exists(name))
                HYMOE_FAIL(Exit::bad_input,
                           path,
                           ": no ",
                           name,
                           " dataset (an HDF5 request file "
                           "holds /tokens [T] and /offsets [N + 1])");
        n_tokens_ = shape_numel(file_.shape("/tokens"));
        const int64_t n_offsets = shape_numel(file_.shape("/offsets"));
        if (file_.shape("/offsets").size() != 1 || n_offsets < 1)
            HYMOE_FAIL(Exit::bad_input, path, ": /offsets must be 1-D with N + 1 >= 1 entries");
        n_ = n_offsets - 1;
        has_max_new_ = file_.exists("/max_new_tokens");
        if (has_max_new_ && shape_numel(file_.shape("/max_new_tokens")) != n_)
            HYMOE_FAIL(Exit::bad_input, path, ": /max_new_tokens must hold N = ", n_, " entries");
    }

    bool next(Request& r) override {
        if (row_ >= n_)
            return false;
        if (row_ >= window_begin_ + static_cast<int64_t>(offsets_.size()) - 1)
            load_window();
        const int64_t i = row_++, k = i - window_begin_;
        const int64_t begin = offsets_[k], end = offsets_[k + 1];
        r = Request{};
        r.line = i + 1;
        r.id = "row-" + std::to_string(i);
        if (begin < 0 || end < begin || end > n_tokens_ || (i == 0 && begin != 0))
            HYMOE_FAIL(Exit::bad_input,
                       path_,
                       ":",
                       r.line,
                       ": offsets [",
                       begin,
                       ", ",
                       end,
                       ") are not a range of /tokens (",
                       n_tokens_,
                       " tokens)");
        if (end == begin)
            HYMOE_FAIL(Exit::bad_input, path_, ":", r.line, ": an empty prompt");
        r.tokens = file_.ints("/tokens", begin, end - begin);
        for (int64_t t : r.tokens)
            if (t < 0)
                HYMOE_FAIL(
                    Exit::bad_input, path_, ":", r.line, ": /tokens holds ", t, ", not a token id");
        if (has_max_new_) {
            const int64_t m = max_new_[k];
            if (m < 0 || m > (1 << 24))
                HYMOE_FAIL(Exit::bad_input,
                           path_,
                           ":",
                           r.line,
                           ": max_new_tokens must be from 0 to 16777216, not ",
                           m);
            r.max_new_tokens = static_cast<int>(m);
        }
        return true;
    }

private:
    static H5Reader open(const std::string& path) {
        if (!std::filesystem::is_regular_file(path))
            HYMOE_FAIL(Exit::bad_input, path, ": cannot open the request file");
        return H5Reader(path);
    }
    void load_window() {  // offsets (and max_new_tokens) of the next kWindow requests
        window_begin_ = row_;
        const int64_t count = std::min(kWindow, n_ - row_);
        offsets_ = file_.ints("/offsets", row_, count + 1);
        if (has_max_new_)
            max_new_ = file_.ints("/max_new_tokens", row_, count);
    }

    static constexpr int64_t kWindow = 4096;
    std::string path_;
    H5Reader file_;
    int64_t n_ = 0, n_tokens_ = 0, row_ = 0, window_begin_ = 0;
    bool has_max_new_ = false;
    std::vector<int64_t> offsets_, max_new_;  // [window + 1], [window]
};

}  // namespace

std::unique_ptr<RequestReader> open_h5_requests(const std::string& path) {
    return std::make_unique<H5Requests>(path);
}

}  // namespace hymoe::io
