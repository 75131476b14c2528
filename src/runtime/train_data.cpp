// The LoRA job's data (runtime/train_data.h): seeded document orders, row packing and the
// domain/general mix.
#include "hymoe/runtime/train_data.h"

#include <cmath>
#include <numeric>

#include "hymoe/core/error.h"
#include "hymoe/core/rng.h"
#include "hymoe/io/image.h"
#include "hymoe/model/vision.h"

namespace hymoe::runtime {

DocStream::DocStream(const std::string& path, uint64_t seed, uint32_t stream, bool shuffle)
    : data_(path), seed_(seed), stream_(stream), shuffle_(shuffle) {
    shuffle_epoch();
}

void DocStream::shuffle_epoch() {
    order_.resize(static_cast<size_t>(data_.size()));
    std::iota(order_.begin(), order_.end(), int64_t{0});
    if (!shuffle_)
        return;
    Philox rng(seed_, stream_, static_cast<uint32_t>(cursor_.epoch));
    for (int64_t i = data_.size() - 1; i > 0; --i) {  // Fisher-Yates
        const int64_t j = static_cast<int64_t>(rng.next_u32() % static_cast<uint32_t>(i + 1));
        std::swap(order_[i], order_[j]);
    }
}

int64_t DocStream::next() {
    if (cursor_.pos == data_.size()) {
        cursor_ = {cursor_.epoch + 1, 0};
        shuffle_epoch();
    }
    return order_[cursor_.pos++];
}

void DocStream::seek(DocCursor c) {
    const bool new_epoch = c.epoch != cursor_.epoch;
    cursor_ = c;
    if (new_epoch)
        shuffle_epoch();
}

RowPlan plan_row(DocStream& stream, int source, int64_t seq_len) {
    RowPlan row;
    row.source = source;
    int64_t used = 0, empty = 0;
    for (;;) {
        const DocCursor before = stream.cursor();
        const int64_t doc = stream.next();
        const int64_t len = stream.data().length(doc);
        if (len == 0) {
            if (++empty > stream.data().size())
                HYMOE_FAIL(Exit::bad_input, stream.data().path(), ": every document is empty");
            continue;
        }
        if (!row.docs.empty() && used + len > seq_len) {
            stream.seek(before);  // it opens the next row
            return row;
        }
        row.docs.push_back(doc);
        used += std::min(len, seq_len);
        if (used >= seq_len)
            return row;
    }
}

model::TrainBatch load_rows(const std::vector<RowPlan>& plan,
                            int64_t begin,
                            int64_t count,
                            const std::vector<const DocStream*>& sources,
                            int64_t seq_len,
                            std::vector<DocImages>* images) {
    model::TrainBatch b;
    b.batch.offsets = {0};
    std::vector<int64_t> tokens;
    std::vector<uint8_t> mask;
    for (int64_t r = begin; r < begin + count; ++r) {
        const RowPlan& row = plan[r];
        for (int64_t doc : row.docs) {
            const io::TokenDataset& data = sources[row.source]->data();
            data.read(doc, tokens, mask);
            const int64_t n = std::min<int64_t>(static_cast<int64_t>(tokens.size()), seq_len);
            std::vector<std::string> files = data.images(doc);
            if (images && !files.empty())
                images->push_back({cat(data.path(), ": document ", doc),
                                   static_cast<int64_t>(b.tokens.size()),
                                   n,
                                   std::move(files)});
            for (int64_t t = 0; t < n; ++t) {
                b.tokens.push_back(tokens[t]);
                b.targets.push_back(t + 1 < n && mask[t + 1] ? tokens[t + 1] : -1);
            }
            b.batch.offsets.push_back(b.batch.offsets.back() + n);
            b.batch.pos0.push_back(0);
        }
    }
    return b;
}

void splice_images(const model::Model& m,
                   const std::vector<DocImages>& images,
                   model::TrainBatch& b) {
    if (images.empty())
        return;
    const model::VisionConfig& v = m.cfg.vision;
    std::vector<io::Image> decoded;
    for (const DocImages& doc : images) {
        if (!v.present)
            HYMOE_FAIL(Exit::bad_input, doc.where, " has images but the model has no vision tower");
        int64_t tokens = 0;
        for (const std::string& f : doc.files) {
            try {
                decoded.push_back(
                    io::load_image(f, {v.patch_size, v.merge, 4096, int64_t{1} << 26}));
            } catch (const Error& e) {
                HYMOE_FAIL(e.code(), doc.where, ": ", e.what());
            }
            tokens += model::vision_tokens(v, decoded.back().grid_h, decoded.back().grid_w, 1);
        }
        int64_t placeholders = 0;
        for (int64_t r = doc.first_row; r < doc.first_row + doc.rows; ++r)
            if (b.tokens[r] == v.media_token_id)
                b.media.rows.push_back(r), ++placeholders;
        if (placeholders != tokens)
            HYMOE_FAIL(Exit::bad_input,
                       doc.where,
                       ": ",
                       placeholders,
                       " media placeholder tokens (id ",
                       v.media_token_id,
                       ", within batch.seq_len) but its images make ",
                       tokens,
                       " image tokens");
    }
    std::vector<model::VisionImage> views;
    for (const io::Image& im : decoded)
        views.push_back({im.grid_h, im.grid_w, im.pixels.data()});
    b.media.embeds =
        Buffer(DType::f32, {static_cast<int64_t>(b.media.rows.size()), m.cfg.hidden_size});
    model::vision_forward(m.cfg, m.vision, views, 1, b.media.embeds.view());
}

TrainMix::TrainMix(const std::string& domain,
                   const std::string& general,
                   double domain_ratio,
                   int64_t seq_len,
                   uint64_t seed)
    : domain_ratio_(domain_ratio), seq_len_(seq_len) {
    streams_.push_back(std::make_unique<DocStream>(domain, seed, 0xD0, true));
    if (!general.empty())
        streams_.push_back(std::make_unique<DocStream>(general, seed, 0x6E, true));
}

std::vector<RowPlan> TrainMix::plan(int64_t rows) {
    std::vector<RowPlan> out;
    for (int64_t i = 0; i < rows; ++i, ++row_) {
        const auto g = static_cast<double>(row_);
        const bool domain = streams_.size() == 1 ||
                            std::floor((g + 1) * domain_ratio_) > std::floor(g * domain_ratio_);
        const int source = domain ? 0 : 1;
        out.push_back(plan_row(*streams_[source], source, seq_len_));
    }
    return out;
}

model::TrainBatch TrainMix::load(const std::vector<RowPlan>& plan,
                                 int64_t begin,
                                 int64_t count,
                                 std::vector<DocImages>* images) const {
    std::vector<const DocStream*> sources;
    for (const auto& s : streams_)
        sources.push_back(s.get());
    return load_rows(plan, begin, count, sources, seq_len_, images);
}

std::vector<DocCursor> TrainMix::cursors() const {
    std::vector<DocCursor> c;
    for (const auto& s : streams_)
        c.push_back(s->cursor());
    return c;
}

void TrainMix::seek(const std::vector<DocCursor>& cursors, int64_t rows_planned) {
    row_ = rows_planned;
    for (size_t i = 0; i < streams_.size() && i < cursors.size(); ++i)
        streams_[i]->seek(cursors[i]);
}

}  // namespace hymoe::runtime
