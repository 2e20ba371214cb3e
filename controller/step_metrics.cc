#include "controller/step_metrics.h"

#include <algorithm>

namespace baton {

baton::v1::StepMetrics AggregateStep(const std::vector<CallResult<baton::v1::RunStepResponse>>& results, int index,
                                     double wall_ms) {
  baton::v1::StepMetrics m;
  m.set_step_ms(wall_ms);
  for (const auto& r : results) {
    const auto& rm = r.response.metrics(index);
    m.set_step(rm.step());
    if (rm.has_loss() && !m.has_loss()) {
      m.set_has_loss(true);
      m.set_loss(rm.loss());
      m.set_grad_norm(rm.grad_norm());
    }
    m.set_tokens(m.tokens() + rm.tokens());
    m.set_comm_bytes(std::max(m.comm_bytes(), rm.comm_bytes()));
    m.set_state_bytes(std::max(m.state_bytes(), rm.state_bytes()));
    m.set_peak_unsharded_param_bytes(std::max(m.peak_unsharded_param_bytes(), rm.peak_unsharded_param_bytes()));
    m.set_peak_logits_elements(std::max(m.peak_logits_elements(), rm.peak_logits_elements()));
    m.set_peak_live_microbatches(std::max(m.peak_live_microbatches(), rm.peak_live_microbatches()));
    m.set_idle_ms(std::max(m.idle_ms(), rm.idle_ms()));
    m.set_peak_live_activation_bytes(std::max(m.peak_live_activation_bytes(), rm.peak_live_activation_bytes()));
    m.set_memory_growth_bytes(std::max(m.memory_growth_bytes(), rm.memory_growth_bytes()));
    m.set_peak_tensor_bytes(std::max(m.peak_tensor_bytes(), rm.peak_tensor_bytes()));
    m.set_peak_reserved_bytes(std::max(m.peak_reserved_bytes(), rm.peak_reserved_bytes()));
    m.set_shared_memory_bytes(std::max(m.shared_memory_bytes(), rm.shared_memory_bytes()));
    m.set_comm_wait_ms(std::max(m.comm_wait_ms(), rm.comm_wait_ms()));
    m.set_comm_ms(std::max(m.comm_ms(), rm.comm_ms()));
    m.set_compute_ms(std::max(m.compute_ms(), rm.compute_ms()));
  }
  m.set_tokens_per_s(wall_ms > 0 ? m.tokens() / (wall_ms / 1e3) : 0);
  return m;
}

}  // namespace baton
