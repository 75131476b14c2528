// The LoRA job's data: documents of the domain and general token datasets mixed per batch at
// domain_ratio : general_ratio, packed into rows of seq_len tokens, deterministic by seed.
// Each dataset is read in a seeded random order, a new permutation per epoch; its cursor (epoch,
// position) is the whole state, so a checkpoint's cursors resume the exact document sequence.
// Row g of a step is a domain row when ⌊(g+1)·domain_ratio⌋ > ⌊g·domain_ratio⌋ (so every step
// holds the ratio to within one row). A row packs whole documents while they fit (a document
// longer than seq_len alone is cut to seq_len); every document stays its own sequence of the
// packed batch (KDA state and attention reset at its start) and predicts its own next tokens
// where its loss mask is 1. The global batch of a step is planned identically on every rank,
// then each rank loads only its rows: the rows and targets do not depend on the layout.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hymoe/io/token_data.h"
#include "hymoe/model/train.h"

namespace hymoe::runtime {

struct DocCursor {
    int64_t epoch = 0, pos = 0;
};

// One dataset read in a seeded random order (or in file order), epoch after epoch.
class DocStream {
public:
    DocStream(const std::string& path, uint64_t seed, uint32_t stream, bool shuffle);
    const io::TokenDataset& data() const { return data_; }
    int64_t next();  // the next document's index; advances the cursor
    DocCursor cursor() const { return cursor_; }
    void seek(DocCursor c);

private:
    void shuffle_epoch();
    io::TokenDataset data_;
    uint64_t seed_;
    uint32_t stream_;
    bool shuffle_;
    DocCursor cursor_;
    std::vector<int64_t> order_;  // [N] this epoch's document order
};

// The documents of one packed row.
struct RowPlan {
    int source = 0;  // 0 domain (or eval file), 1 general
    std::vector<int64_t> docs;
};

// Packs documents from `stream` into one row of at most seq_len tokens.
RowPlan plan_row(DocStream& stream, int source, int64_t seq_len);

// The images of one document of a packed batch (datasets with /images).
struct DocImages {
    std::string where;  // "FILE: document I", for errors
    int64_t first_row = 0, rows = 0;
    std::vector<std::string> files;
};

// Rows [begin, begin + count) of `plan` as one packed batch (tokens, targets, sequences); the
// documents' images, when a dataset has them, go to `images` for splice_images.
model::TrainBatch load_rows(const std::vector<RowPlan>& plan,
                            int64_t begin,
                            int64_t count,
                            const std::vector<const DocStream*>& sources,
                            int64_t seq_len,
                            std::vector<DocImages>* images = nullptr);

// Encodes the documents' images with the model's (frozen) vision tower, one call for the batch,
// and sets b.media to replace each document's placeholder tokens in order. A document whose
// placeholders do not match its images' tokens (or cut by seq_len), an unreadable image, or a
// model without a vision tower: Exit::bad_input naming the document.
void splice_images(const model::Model& m,
                   const std::vector<DocImages>& images,
                   model::TrainBatch& b);

// The training mix of the deck's domain and general datasets.
class TrainMix {
public:
    TrainMix(const std::string& domain,
             const std::string& general,  // "" when general_ratio = 0
             double domain_ratio,
             int64_t seq_len,
             uint64_t seed);
    // The next `rows` rows of the global batch (the same on every rank).
    std::vector<RowPlan> plan(int64_t rows);
    model::TrainBatch load(const std::vector<RowPlan>& plan,
                           int64_t begin,
                           int64_t count,
                           std::vector<DocImages>* images = nullptr) const;
    std::vector<DocCursor> cursors() const;  // [domain, general]
    void seek(const std::vector<DocCursor>& cursors, int64_t rows_planned);
    int64_t rows_planned() const { return row_; }

private:
    std::vector<std::unique_ptr<DocStream>> streams_;  // domain, general
    double domain_ratio_;
    int64_t seq_len_;
    int64_t row_ = 0;  // rows planned so far (the mix position)
};

}  // namespace hymoe::runtime
