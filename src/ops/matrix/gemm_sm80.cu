// The portable tensor-core GEMM tier (sm_80 on): not written yet, so it takes no arguments.
#include "ops/matrix/gemm.cuh"

namespace tessera::matrix {

std::string Sm80Tier::Plan::describe() const { return "not implemented"; }
bool Sm80Tier::can_implement(const GemmArgs&, const GemmCtx&) { return false; }
Sm80Tier::Plan Sm80Tier::plan(const GemmArgs&, const GemmCtx&) { return {}; }
void Sm80Tier::launch(const GemmArgs&, const Plan&, cudaStream_t) {}

}  // namespace tessera::matrix
