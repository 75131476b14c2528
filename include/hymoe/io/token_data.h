// HDF5 token datasets for training and evaluation (the format the tokenize job writes):
//   /tokens    integer [T]      every document's tokens, concatenated
//   /offsets   integer [N + 1]  document i is tokens [offsets[i], offsets[i+1])
//   /loss_mask integer [T]      optional: 1 where the token is a training target (the prompt
//                               part of a prompt/completion pair is 0); absent: every token
//   /images    string [N]       optional: document i's image files, ';'-separated, relative to
//                               the dataset's folder ("" none); their image tokens replace the
//                               document's media placeholder tokens in order (model-math §8)
// The offsets (and image lists) are read whole at open; tokens are read per document.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hymoe/io/h5.h"

namespace hymoe::io {

class TokenDataset {
public:
    // Exit::bad_input naming the file for a missing dataset or offsets that are not a range.
    explicit TokenDataset(const std::string& path);
    int64_t size() const { return static_cast<int64_t>(offsets_.size()) - 1; }  // documents
    int64_t length(int64_t i) const { return offsets_[i + 1] - offsets_[i]; }
    const std::string& path() const { return path_; }
    // Document i's tokens and loss mask (1 = target).
    void read(int64_t i, std::vector<int64_t>& tokens, std::vector<uint8_t>& mask) const;
    // Document i's image files (resolved paths), in placeholder order; empty without /images.
    std::vector<std::string> images(int64_t i) const;
    // "" when every token id is in [0, vocab); else where the first one outside is:
    // "document 3 (source line 7) holds token id 257, outside the model's vocabulary [0, 256)"
    // (the source line when the file has /line). Reads /tokens in blocks.
    std::string out_of_vocab(int64_t vocab) const;

private:
    std::string path_;
    H5Reader file_;
    std::vector<int64_t> offsets_;
    bool has_mask_ = false;
    std::vector<std::string> images_;  // [N] or empty
};

}  // namespace hymoe::io
