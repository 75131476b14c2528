// The KDA block's sizes from its config (private to src/model: kda.cpp and kda_backward.cpp).
#pragma once

#include <cstdint>

#include "hymoe/model/config.h"

namespace hymoe::model {

// d hidden, H heads, K = V head dim, D = H·K, W conv width.
struct KdaDims {
    int64_t d, H, K, D, W;
    explicit KdaDims(const ModelConfig& cfg)
        : d(cfg.hidden_size),
          H(cfg.kda.n_head),
          K(cfg.kda.head_dim),
          D(H * K),
          W(cfg.kda.conv_kernel) {}
};

}  // namespace hymoe::model
