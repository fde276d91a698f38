// The `tessera` command. Parsing and planning are pure functions (no GPU touched), so the whole
// command line can be tested on a machine without one; run_cli is the only entry that runs ops.
#pragma once

#include <cstdint>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tessera/tensor.hpp"

namespace tessera::ops {
struct OpInfo;  // harness/ops/registry.hpp, kept out of this header so tools/ needs no src/ path
}

namespace tessera::cli {

// An M x N x K problem: what `tessera tune matmul --shapes` takes ("4096x4096x4096").
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
};
// An attention call, batch x seq_q x seq_k x heads_q x heads_kv x head_dim: what `tessera tune
// attention --shapes` takes ("1x1x32768x32x8x128").
struct AttentionShape {
  int64_t batch = 0, seq_q = 0, seq_k = 0, heads_q = 0, heads_kv = 0, head_dim = 0;
};
// Comma-separated items of positive dimensions: three (MxNxK) go to `gemm`, six to `attention`.
void parse_tune_shapes(const std::string& flag, const std::string& text, std::vector<GemmShape>& gemm,
                       std::vector<AttentionShape>& attention);

// A bad command line. run_cli prints "tessera: <message>" and exits 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Verb { help, info, verify, bench, profile, tune };

struct Args {
  Verb verb = Verb::help;
  bool help = false;             // print the usage of `verb` (the verb list for Verb::help), exit 0
  bool version = false;          // --version: print the version, exit 0
  std::vector<std::string> ops;  // verify, bench: empty means every op; profile: exactly one
  std::vector<DType> dtypes;     // bench: empty means each op's own; profile: at most one
  std::vector<std::string> dtype_args;  // --dtype items as typed: parsed into `dtypes` once the
                                        // ops are known, so an error can name what they take
  std::vector<int64_t> sizes;    // bench: empty means each op's bench_sizes; profile: at most one
  std::string out_dir;           // bench --out
  int device = 0;
  int reps = 0;                  // bench --reps: exactly this many timed reps; 0 keeps the default
  bool large = false;            // verify --large
  bool list = false;             // verify --list: the cases' names, not run
  bool full = false;             // verify --full: every case, not the default selection
  std::string selection_out;     // verify --write-selection: the fresh default selection's file
  int seed = 0;                  // verify --seed: the random inputs' seed
  bool peaks = true;             // info, bench: --no-peaks clears it
  bool graph = false;            // bench --graph
  bool quick = false;            // bench --quick: three of each op's sizes
  bool flush_l2 = true;          // bench --no-flush clears it
  std::vector<GemmShape> shapes;  // tune --shapes: matmul's
  std::vector<AttentionShape> attention_shapes;  // tune --shapes: attention's
  std::vector<std::string> layouts;  // tune --layout: "nt" (default), "nn", "tn", "tt"
  bool show = false;             // tune --show: list the cache instead of tuning
};

// args[0] is the program name. Throws UsageError for unknown verbs, options, ops or bad values.
Args parse_args(const std::vector<std::string>& args);

// "1048576", "2^20", "1M", "4k" (k/M/G are powers of 1024). Positive only. `flag` names the
// option in the error message.
int64_t parse_size(const std::string& flag, const std::string& text);
// Comma-separated sizes.
std::vector<int64_t> parse_sizes(const std::string& flag, const std::string& text);
// torch's names (float32, float16, bfloat16, ...), also fp32/fp16/bf16 and a "torch." prefix.
DType parse_dtype(const std::string& flag, const std::string& text);
std::vector<DType> parse_dtypes(const std::string& flag, const std::string& text);
// "2^20" for powers of two from 1024 up, else the plain number.
std::string format_size(int64_t size);

// One benchmark case to build: what `bench` times and `profile` traces.
struct BenchItem {
  const ops::OpInfo* op = nullptr;
  DType dtype = DType::float32;
  int64_t size = 0;
};
// Expands bench/profile arguments with the ops' defaults. Throws UsageError when a named op does
// not support a requested dtype (unnamed ops, i.e. "all", just skip such dtypes).
std::vector<BenchItem> bench_plan(const Args& args);

// The ops that names select: each name with its variants (ops::select_ops, so "gelu" means every
// gelu op), in registry order without repeats; every op when names is empty.
std::vector<const ops::OpInfo*> resolve_ops(const std::vector<std::string>& names);

// The ops `tune` takes: those with configs in the tune cache ("gemm" is matmul's alias there).
std::vector<std::string> tunable_ops();

std::string verb_name(Verb verb);
// Usage text of a verb; Verb::help gives the list of verbs.
std::string usage(Verb verb);
// "tessera 0.1.0": what --version prints.
std::string version_line();
// The dtypes each op takes, ops with the same list grouped: "add, gelu: float32, float16; isin:
// int32, ...". What a --dtype error and the --help texts show.
std::string dtypes_by_op(const std::vector<const ops::OpInfo*>& ops);

// Runs the command; returns the exit status (0 ok, 1 failure or no GPU, 2 bad command line).
int run_cli(const std::vector<std::string>& args, std::ostream& out = std::cout,
            std::ostream& err = std::cerr);
int run_cli(int argc, char** argv);

}  // namespace tessera::cli
