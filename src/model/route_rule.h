// The router's rule for ops::moe_route (backend/moe_route.h) from a model's config: the family
// differences of model/router.cpp (kimi_linear's 0.0 group fill and 1e-20 renormalisation) as
// fields. Private to src/model.
#pragma once

#include "hymoe/backend/moe_route.h"
#include "hymoe/model/config.h"

namespace hymoe::model::detail {

ops::MoeRouteRule route_rule(const ModelConfig& cfg);

}  // namespace hymoe::model::detail
