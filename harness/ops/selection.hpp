// The default run of `tessera verify`: the fewest cases that still run every op on every dtype
// and every kernel tier a full run reaches. `--full` runs every case.
//
// The selection is a list of (op, case name) pairs, harness/ops/verify_default.txt, compiled into
// the harness. It is derived from a full run on a GPU: each case's tiers are traced
// (runtime::set_tier_trace), each case covers the (dtype, traced op and tier) pairs it ran, and a
// greedy cover keeps, pair by pair, the cheapest case that adds the most pairs not yet covered.
// `tessera verify --full --write-selection FILE` writes it anew; every full run says which
// pairs the compiled-in selection misses. An op the list does not name at all (a new op) runs
// every case by default.
#pragma once

#include <string>
#include <vector>

namespace tessera::ops {

// Whether the default run takes case `name` of op `op`.
bool selected_by_default(const std::string& op, const std::string& name);

// The compiled-in selection as (op, case name) pairs, in the file's order.
const std::vector<std::pair<std::string, std::string>>& default_selection();

// The dtype a case runs on: the first dtype name among the words of its name ("" if none).
std::string case_dtype(const std::string& name);

// One case of a full run: what it covers (dtype + ":" + traced op + ":" + tier, or the dtype
// alone where no tier was traced) and its wall time.
struct CaseCoverage {
  std::string op, name;
  std::vector<std::string> covers;
  double seconds = 0;
};

// The greedy cover of each op's pairs: indices into `cases`, in their order.
std::vector<std::size_t> cover(const std::vector<CaseCoverage>& cases);

// The pairs of `cases` that the compiled-in selection's cases (as they ran here) do not cover,
// "op: pair" each.
std::vector<std::string> uncovered_by_default(const std::vector<CaseCoverage>& cases);

}  // namespace tessera::ops
