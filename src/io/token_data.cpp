// HDF5 token datasets (io/token_data.h): open checks, then one hyperslab read per document.
#include "hymoe/io/token_data.h"

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "hymoe/core/error.h"

namespace hymoe::io {

TokenDataset::TokenDataset(const std::string& path) : path_(path), file_(path) {
    for (const char* name : {"/tokens", "/offsets"})
        if (!file_.exists(name))
            HYMOE_FAIL(Exit::bad_input,
                       path,
                       ": no ",
                       name,
                       " dataset (a token dataset holds /tokens [T], /offsets [N + 1] and "
                       "optionally /loss_mask [T])");
    offsets_ = file_.ints("/offsets");
    const int64_t n_tokens = shape_numel(file_.shape("/tokens"));
    if (offsets_.size() < 2 || offsets_.front() != 0 || offsets_.back() != n_tokens)
        HYMOE_FAIL(Exit::bad_input,
                   path,
                   ": /offsets must start at 0 and end at the token count ",
                   n_tokens,
                   " with at least one document");
    for (size_t i = 1; i < offsets_.size(); ++i)
        if (offsets_[i] < offsets_[i - 1])
            HYMOE_FAIL(Exit::bad_input, path, ": /offsets decrease at document ", i - 1);
    if (file_.exists("/images")) {
        images_ = file_.strings("/images");
        if (static_cast<int64_t>(images_.size()) != size())
            HYMOE_FAIL(Exit::bad_input, path, ": /images does not have one entry per document");
    }
    has_mask_ = file_.exists("/loss_mask");
    if (has_mask_ && shape_numel(file_.shape("/loss_mask")) != n_tokens)
        HYMOE_FAIL(Exit::bad_input, path, ": /loss_mask is not as long as /tokens");
}

std::vector<std::string> TokenDataset::images(int64_t i) const {
    std::vector<std::string> files;
    if (images_.empty())
        return files;
    const std::filesystem::path dir = std::filesystem::path(path_).parent_path();
    std::istringstream list(images_[static_cast<size_t>(i)]);
    for (std::string f; std::getline(list, f, ';');)
        if (!f.empty())
            files.push_back((dir / f).string());
    return files;
}

void TokenDataset::read(int64_t i, std::vector<int64_t>& tokens, std::vector<uint8_t>& mask) const {
    const int64_t begin = offsets_[i], n = length(i);
    tokens = n > 0 ? file_.ints("/tokens", begin, n) : std::vector<int64_t>{};
    mask.assign(static_cast<size_t>(n), 1);
    if (has_mask_ && n > 0) {
        const std::vector<int64_t> m = file_.ints("/loss_mask", begin, n);
        for (int64_t t = 0; t < n; ++t)
            mask[t] = m[t] != 0;
    }
}

std::string TokenDataset::out_of_vocab(int64_t vocab) const {
    constexpr int64_t kBlock = int64_t{1} << 20;
    const int64_t n_tokens = offsets_.back();
    for (int64_t begin = 0; begin < n_tokens; begin += kBlock) {
        const std::vector<int64_t> t =
            file_.ints("/tokens", begin, std::min(kBlock, n_tokens - begin));
        const auto bad =
            std::find_if(t.begin(), t.end(), [&](int64_t id) { return id < 0 || id >= vocab; });
        if (bad == t.end())
            continue;
        const int64_t at = begin + (bad - t.begin());
        const int64_t doc =
            std::upper_bound(offsets_.begin(), offsets_.end(), at) - offsets_.begin() - 1;
        std::string line;
        if (file_.exists("/line"))
            line = cat(" (source line ", file_.ints("/line", doc, 1).front(), ")");
        return cat("document ",
                   doc,
                   line,
                   " holds token id ",
                   *bad,
                   ", outside the model's vocabulary [0, ",
                   vocab,
                   ")");
    }
    return "";
}

}  // namespace hymoe::io
