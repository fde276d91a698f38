// Command-line parsing and planning for `tessera`. Nothing here touches a GPU.
#include "cli.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>
#include <string_view>

#include "ops/registry.hpp"
#include "tessera/version.hpp"

namespace tessera::cli {
namespace {

// One option of one verb. The same table drives parsing and the --help text.
struct Option {
  const char* name;
  const char* metavar;  // nullptr for a switch
  const char* help;
  void (*apply)(Args& args, const std::string& value);
};

struct VerbSpec {
  Verb verb;
  const char* name;
  const char* operands;  // "" when the verb takes no ops
  const char* summary;
  std::vector<Option> options;
};

// Non-negative int for --device and --reps.
int parse_int(const std::string& flag, const std::string& text, int min) {
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value < min)
    throw UsageError(flag + ": expected an integer >= " + std::to_string(min) + ", got '" + text +
                     "'");
  return value;
}

std::vector<std::string> split(const std::string& flag, const std::string& text) {
  std::vector<std::string> items;
  size_t start = 0;
  while (true) {
    size_t comma = text.find(',', start);
    items.push_back(text.substr(start, comma - start));
    if (items.back().empty()) throw UsageError(flag + ": empty item in '" + text + "'");
    if (comma == std::string::npos) return items;
    start = comma + 1;
  }
}

const Option kDevice{"--device", "N", "GPU to use (default 0)", [](Args& a, const std::string& v) {
                       a.device = parse_int("--device", v, 0);
                     }};
const Option kNoPeaks{"--no-peaks", nullptr, "skip measuring the copy and GEMM peaks",
                      [](Args& a, const std::string&) { a.peaks = false; }};

const std::vector<VerbSpec>& verb_specs() {
  static const std::vector<VerbSpec> specs = {
      {Verb::info, "info", "", "GPU properties and the measured copy and GEMM peaks",
       {kDevice, kNoPeaks}},
      {Verb::verify, "verify", "[OPS...]", "check ops against their CPU references (default: all)",
       {{"--large", nullptr, "also run the cases over 2^31 elements",
         [](Args& a, const std::string&) { a.large = true; }},
        {"--full", nullptr,
         "run every case (default: the fewest cases that run every op, dtype and kernel tier; "
         "ops named run all of theirs)",
         [](Args& a, const std::string&) { a.full = true; }},
        {"--write-selection", "FILE",
         "run every case and write the default selection of the ops run to FILE (each op's lines "
         "stand alone: files of disjoint ops concatenate)",
         [](Args& a, const std::string& v) { a.selection_out = v; }},
        {"--list", nullptr, "print each case's op and name instead of running it (no GPU needed)",
         [](Args& a, const std::string&) { a.list = true; }},
        {"--seed", "N", "draw the random inputs from seed N (default 0: the fixed inputs of every run)",
         [](Args& a, const std::string& v) { a.seed = parse_int("--seed", v, 0); }},
        kDevice}},
      {Verb::bench, "bench", "[OPS...]",
       "time ops over dtypes and sizes; report GB/s, TFLOP/s and % of the measured peaks",
       {{"--dtype", "LIST", "dtypes, comma-separated (default: each op's own), e.g. float32,bf16",
         [](Args& a, const std::string& v) {
           for (auto& item : split("--dtype", v)) a.dtype_args.push_back(item);
         }},
        {"--sizes", "LIST", "sizes, comma-separated: 1048576, 2^20, 1M, 4k (meaning: below)",
         [](Args& a, const std::string& v) {
           for (int64_t s : parse_sizes("--sizes", v)) a.sizes.push_back(s);
         }},
        {"--quick", nullptr, "each op's smallest, a middle and its largest size (unless --sizes)",
         [](Args& a, const std::string&) { a.quick = true; }},
        {"--out", "DIR", "write DIR/bench.csv, DIR/bench.json and one SVG per op and dtype",
         [](Args& a, const std::string& v) { a.out_dir = v; }},
        {"--reps", "N", "exactly N timed repetitions (default: at least 25, up to 100 ms)",
         [](Args& a, const std::string& v) { a.reps = parse_int("--reps", v, 1); }},
        {"--graph", nullptr, "time replays of a CUDA graph (for launch-bound sizes)",
         [](Args& a, const std::string&) { a.graph = true; }},
        {"--no-flush", nullptr, "keep the L2 warm between repetitions",
         [](Args& a, const std::string&) { a.flush_l2 = false; }},
        kNoPeaks, kDevice}},
      {Verb::profile, "profile", "OP", "per-kernel trace of one op: grid, registers, smem, time",
       {{"--dtype", "D", "dtype (default: the op's first)",
         [](Args& a, const std::string& v) { a.dtype_args = {v}; }},
        {"--size", "N", "size (default: the op's largest bench size; meaning: below)",
         [](Args& a, const std::string& v) { a.sizes = {parse_size("--size", v)}; }},
        kDevice}},
      {Verb::tune, "tune", "[OPS...]",
       "tune the configs of ops that have them ahead of time into the tune cache, or list the "
       "cache (--show)",
       {{"--shapes", "LIST",
         "problems, comma-separated: MxNxK for matmul (e.g. 4096x4096x4096,16x4096x14336), "
         "BxSQxSKxHQxHKxD for attention (batch, seq_q, seq_k, heads_q, heads_kv, head_dim; "
         "e.g. 1x1x32768x32x8x128)",
         [](Args& a, const std::string& v) { parse_tune_shapes("--shapes", v, a.shapes, a.attention_shapes); }},
        {"--dtype", "LIST", "input dtypes, comma-separated (default bfloat16)",
         [](Args& a, const std::string& v) {
           for (auto& item : split("--dtype", v)) a.dtype_args.push_back(item);
         }},
        {"--layout", "LIST",
         "nt (default: input row-major, other the transpose of a row-major [N, K], as in a "
         "linear layer), nn, tn, tt; comma-separated",
         [](Args& a, const std::string& v) {
           for (auto& item : split("--layout", v)) {
             if (item != "nn" && item != "nt" && item != "tn" && item != "tt")
               throw UsageError("--layout: expected nn, nt, tn or tt, got '" + item + "'");
             a.layouts.push_back(item);
           }
         }},
        {"--show", nullptr, "list the tune cache (every machine's records) and exit",
         [](Args& a, const std::string&) { a.show = true; }},
        kDevice}},
      {Verb::help, "help", "[VERB]", "list the verbs, or show one verb's options", {}},
  };
  return specs;
}

const VerbSpec& spec_of(Verb verb) {
  for (const auto& s : verb_specs())
    if (s.verb == verb) return s;
  throw std::logic_error("tessera: verb missing from the table");
}

std::string op_names() {
  std::string names;
  for (const auto& op : ops::all_ops()) names += (names.empty() ? "" : ", ") + op.name;
  return names;
}

// The ops with configs: the tune cache's only users, which `tune` drives through their library
// calls (tools/commands.cpp). Other ops have nothing to tune, so `tune` takes only these.
struct TunableOp {
  const char* name;
  const char* alias;  // another name `tune` takes for it; nullptr for none
  const char* tuned;  // what is tuned, for the --help text
};
const TunableOp kTunableOps[] = {
    {"matmul", "gemm", "the GEMM config per shape bucket, dtype and layout"},
    {"attention", nullptr, "the decode tier's split over the keys (seq_q <= 16)"},
};

// "matmul (alias gemm), attention": what a tune error lists.
std::string tunable_op_names() {
  std::string names;
  for (const auto& t : kTunableOps)
    names += (names.empty() ? "" : ", ") + std::string(t.name) +
             (t.alias ? std::string(" (alias ") + t.alias + ")" : "");
  return names;
}

// The tunable op `arg` names (an alias gives its op); a UsageError naming the tunable ops else.
std::string tunable_op(const std::string& arg) {
  for (const auto& t : kTunableOps)
    if (arg == t.name || (t.alias && arg == t.alias)) return t.name;
  const std::string what = ops::select_ops(arg).empty() ? "unknown op '" + arg + "'"
                                                        : "op '" + arg + "' has no configs to tune";
  throw UsageError("tune: " + what + " (ops with configs: " + tunable_op_names() + ")");
}

// The tune --help lines of the tunable ops: each with what of it is tuned.
std::string tunable_op_lines() {
  const auto label = [](const TunableOp& t) {
    return std::string(t.name) + (t.alias ? std::string(", alias ") + t.alias : "");
  };
  size_t width = 0;
  for (const auto& t : kTunableOps) width = std::max(width, label(t).size());
  std::string text;
  for (const auto& t : kTunableOps) {
    std::string left = "  " + label(t);
    left.resize(width + 4, ' ');
    text += left + t.tuned + "\n";
  }
  return text;
}

Verb parse_verb(const std::string& text) {
  for (const auto& s : verb_specs())
    if (text == s.name) return s.verb;
  std::string names;
  for (const auto& s : verb_specs()) names += (names.empty() ? "" : ", ") + std::string(s.name);
  throw UsageError("unknown verb '" + text + "' (verbs: " + names + ")");
}

bool is_help(const std::string& arg) { return arg == "--help" || arg == "-h"; }

bool supports(const ops::OpInfo& op, DType dtype) {
  return std::find(op.dtypes.begin(), op.dtypes.end(), dtype) != op.dtypes.end();
}

std::string dtype_list(const std::vector<DType>& dtypes) {
  std::string s;
  for (DType d : dtypes) s += (s.empty() ? "" : ", ") + std::string(dtype_name(d));
  return s;
}

// "gelu, gelu_backward", or "every rowwise op" where `ops` hold the whole family.
std::string op_label(const std::vector<const ops::OpInfo*>& ops) {
  std::string label;
  auto add = [&](const std::string& part) { label += (label.empty() ? "" : ", ") + part; };
  auto whole_family = [&](const std::string& family) {
    for (const auto& op : ops::all_ops())
      if (op.family == family && std::find(ops.begin(), ops.end(), &op) == ops.end()) return false;
    return true;
  };
  std::vector<std::string> families;
  for (const ops::OpInfo* op : ops) {
    if (std::find(families.begin(), families.end(), op->family) != families.end()) continue;
    if (whole_family(op->family)) {
      families.push_back(op->family);
      add("every " + op->family + " op");
    } else {
      add(op->name);
    }
  }
  return label;
}

// "every rowwise op: float32, float16, bfloat16": ops that take the same dtypes, in registry order.
std::vector<std::string> dtype_groups(const std::vector<const ops::OpInfo*>& ops) {
  std::vector<std::pair<std::vector<const ops::OpInfo*>, std::string>> groups;  // (ops, dtypes)
  for (const ops::OpInfo* op : ops) {
    const std::string dtypes = dtype_list(op->dtypes);
    auto g = std::find_if(groups.begin(), groups.end(),
                          [&](const auto& p) { return p.second == dtypes; });
    if (g == groups.end()) groups.push_back({{op}, dtypes});
    else g->first.push_back(op);
  }
  std::vector<std::string> lines;
  for (const auto& [members, dtypes] : groups) lines.push_back(op_label(members) + ": " + dtypes);
  return lines;
}

// The ops of one family that mean the same by a size.
struct SizeGroup {
  std::string family, meaning;
  std::vector<const ops::OpInfo*> ops;
};

std::vector<SizeGroup> size_groups() {
  std::vector<SizeGroup> groups;
  for (const auto& op : ops::all_ops()) {
    auto g = std::find_if(groups.begin(), groups.end(), [&](const SizeGroup& x) {
      return x.family == op.family && x.meaning == op.size_meaning;
    });
    if (g == groups.end()) groups.push_back({op.family, op.size_meaning, {&op}});
    else g->ops.push_back(&op);
  }
  return groups;
}

// "loss (cross_entropy)" where the family's ops mean different things by a size, else "loss".
std::string size_label(const SizeGroup& g, const std::vector<SizeGroup>& groups) {
  const auto same_family = [&](const SizeGroup& x) { return x.family == g.family; };
  if (std::count_if(groups.begin(), groups.end(), same_family) == 1) return g.family;
  std::string names;
  for (const ops::OpInfo* op : g.ops) names += (names.empty() ? "" : ", ") + op->name;
  return g.family + " (" + names + ")";
}

// "elementwise", "rowwise", ... with the size meaning and an example of the shape a size gives,
// from the ops' own descriptions: a new family documents itself.
std::string size_meanings() {
  const std::vector<SizeGroup> groups = size_groups();
  size_t width = 0;
  for (const auto& g : groups) width = std::max(width, size_label(g, groups).size());
  std::string text;
  for (const auto& g : groups) {
    std::string line = "  " + size_label(g, groups);
    line.resize(width + 4, ' ');
    line += g.meaning;
    const ops::OpInfo& op = *g.ops.front();
    if (op.bench_shape && !op.dtypes.empty() && !op.bench_sizes.empty()) {
      int64_t size = op.bench_sizes.front();
      line += "; " + format_size(size) + " gives " + op.bench_shape(op.dtypes.front(), size).shape;
    }
    text += line + "\n";
  }
  return text;
}

std::string dtype_lines() {
  std::string text;
  for (const auto& group : dtype_groups(resolve_ops({}))) text += "  " + group + "\n";
  return text;
}

// The ops that a --dtype applies to: profile's one op, or each named op with its variants.
std::vector<const ops::OpInfo*> dtype_ops(const Args& a) {
  const ops::OpInfo* op = a.verb == Verb::profile ? ops::find_op(a.ops.at(0)) : nullptr;
  return op ? std::vector<const ops::OpInfo*>{op} : resolve_ops(a.ops);
}

// --dtype items become dtypes; an unknown name is reported with what the selected ops take.
void parse_dtype_args(Args& a) {
  for (const auto& item : a.dtype_args) {
    try {
      a.dtypes.push_back(parse_dtype("--dtype", item));
    } catch (const UsageError& e) {
      throw UsageError("--dtype: unknown dtype '" + item + "'; the selected ops take " +
                       dtypes_by_op(dtype_ops(a)) + " (short forms: fp32, fp16, bf16, fp64)");
    }
  }
}

}  // namespace

int64_t parse_size(const std::string& flag, const std::string& text) {
  auto bad = [&] {
    return UsageError(flag + ": bad size '" + text + "' (expected N, 2^K, or N with suffix k, M, G)");
  };
  auto too_big = [&] { return UsageError(flag + ": size '" + text + "' is too large"); };
  // from_chars accepts a leading '-', so check for digits first.
  auto read = [&](std::string_view s) {
    uint64_t v = 0;
    if (s.empty() || !std::isdigit(static_cast<unsigned char>(s.front()))) throw bad();
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc::result_out_of_range) throw too_big();
    if (ec != std::errc() || end != s.data() + s.size()) throw bad();
    return v;
  };
  constexpr uint64_t kMax = std::numeric_limits<int64_t>::max();
  std::string_view s = text;
  uint64_t value;
  if (s.starts_with("2^")) {
    uint64_t k = read(s.substr(2));
    if (k > 62) throw too_big();
    value = uint64_t{1} << k;
  } else {
    int shift = 0;
    switch (s.empty() ? '\0' : s.back()) {
      case 'k': case 'K': shift = 10; break;
      case 'M': shift = 20; break;
      case 'G': shift = 30; break;
    }
    if (shift) s.remove_suffix(1);
    value = read(s);
    if (value > (kMax >> shift)) throw too_big();
    value <<= shift;
  }
  if (value > kMax) throw too_big();
  if (value == 0) throw UsageError(flag + ": size must be positive, got '" + text + "'");
  return static_cast<int64_t>(value);
}

std::vector<int64_t> parse_sizes(const std::string& flag, const std::string& text) {
  std::vector<int64_t> sizes;
  for (const auto& item : split(flag, text)) sizes.push_back(parse_size(flag, item));
  return sizes;
}

DType parse_dtype(const std::string& flag, const std::string& text) {
  std::string_view name = text;
  if (name.starts_with("torch.")) name.remove_prefix(6);
  static const std::pair<const char*, DType> aliases[] = {
      {"fp32", DType::float32}, {"float", DType::float32},   {"fp16", DType::float16},
      {"half", DType::float16}, {"bf16", DType::bfloat16},   {"fp64", DType::float64},
      {"double", DType::float64}};
  for (const auto& [alias, dtype] : aliases)
    if (name == alias) return dtype;
  for (int i = 0; i < kDTypeCount; ++i)
    if (name == dtype_name(static_cast<DType>(i))) return static_cast<DType>(i);
  std::string names;
  for (int i = 0; i < kDTypeCount; ++i)
    names += (names.empty() ? "" : ", ") + std::string(dtype_name(static_cast<DType>(i)));
  throw UsageError(flag + ": unknown dtype '" + text + "' (dtypes: " + names +
                   "; also fp32, fp16, bf16, fp64, float, half, double)");
}

std::vector<DType> parse_dtypes(const std::string& flag, const std::string& text) {
  std::vector<DType> dtypes;
  for (const auto& item : split(flag, text)) dtypes.push_back(parse_dtype(flag, item));
  return dtypes;
}

std::string format_size(int64_t size) {
  if (size >= 1024 && (size & (size - 1)) == 0) {
    int k = 0;
    while ((int64_t{1} << k) != size) ++k;
    return "2^" + std::to_string(k);
  }
  return std::to_string(size);
}

std::string verb_name(Verb verb) { return spec_of(verb).name; }

std::string version_line() { return std::string("tessera ") + kVersion; }

std::string dtypes_by_op(const std::vector<const ops::OpInfo*>& ops) {
  std::string text;
  for (const auto& group : dtype_groups(ops)) text += (text.empty() ? "" : "; ") + group;
  return text;
}

// `tessera help [VERB]`, `tessera --help`, `tessera help --help`: the verb list or one verb's usage.
Args parse_help(const std::vector<std::string>& args) {
  Args a;
  a.help = true;
  if (args[1] == "help" && args.size() > 2 && !is_help(args[2]))
    a.verb = parse_verb(args[2]);  // tessera help bench
  if (args.size() > 3) throw UsageError("help: unexpected argument '" + args[3] + "'");
  return a;
}

Args parse_args(const std::vector<std::string>& args) {
  Args a;
  if (args.size() < 2) throw UsageError("no verb given (try 'tessera --help')");
  if (is_help(args[1]) || args[1] == "help") return parse_help(args);
  if (args[1] == "--version") {
    if (args.size() > 2) throw UsageError("--version: unexpected argument '" + args[2] + "'");
    a.version = true;
    return a;
  }
  a.verb = parse_verb(args[1]);
  const VerbSpec& spec = spec_of(a.verb);
  const std::string verb = spec.name;

  // --help wins over anything else on the line, even a bad value before it.
  if (std::any_of(args.begin() + 2, args.end(), is_help)) {
    a.help = true;
    return a;
  }

  for (size_t i = 2; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.size() < 2 || arg[0] != '-') {
      if (!*spec.operands) throw UsageError(verb + ": unexpected argument '" + arg + "'");
      if (a.verb == Verb::tune) {
        a.ops.push_back(tunable_op(arg));
        continue;
      }
      if (ops::select_ops(arg).empty())
        throw UsageError("unknown op '" + arg + "' (known: " + op_names() + ")");
      a.ops.push_back(arg);
      continue;
    }
    size_t eq = arg.find('=');
    std::string name = arg.substr(0, eq);
    auto option = std::find_if(spec.options.begin(), spec.options.end(),
                               [&](const Option& o) { return name == o.name; });
    if (option == spec.options.end())
      throw UsageError(verb + ": unknown option '" + name + "' (try 'tessera " + verb + " --help')");
    std::string value;
    if (eq != std::string::npos) {
      if (!option->metavar) throw UsageError(verb + ": " + name + " takes no value");
      value = arg.substr(eq + 1);
    } else if (option->metavar) {
      // "-5" is a (bad) value, "--graph" is the next option: the value was forgotten.
      if (i + 1 == args.size() || args[i + 1].starts_with("--"))
        throw UsageError(verb + ": " + name + " needs a value (" + option->metavar + ")");
      value = args[++i];
    }
    option->apply(a, value);
  }

  if (a.verb == Verb::profile && a.ops.size() != 1)
    throw UsageError("profile: expected one OP, got " + std::to_string(a.ops.size()) +
                     " (known: " + op_names() + ")");
  if (a.verb == Verb::tune && !a.show) {
    if (a.shapes.empty() && a.attention_shapes.empty())
      throw UsageError("tune: expected --shapes (what to tune) or --show (list the cache)");
    const auto named = [&](const char* op) {
      return a.ops.empty() || std::find(a.ops.begin(), a.ops.end(), op) != a.ops.end();
    };
    if (!a.shapes.empty() && !named("matmul"))
      throw UsageError("tune: --shapes has MxNxK items, and matmul is not among the ops named");
    if (!a.attention_shapes.empty() && !named("attention"))
      throw UsageError("tune: --shapes has attention items (six dimensions), and attention is not among the ops named");
  }
  parse_dtype_args(a);
  return a;
}

void parse_tune_shapes(const std::string& flag, const std::string& text, std::vector<GemmShape>& gemm,
                       std::vector<AttentionShape>& attention) {
  for (const auto& item : split(flag, text)) {
    std::vector<int64_t> dims;
    size_t start = 0;
    while (true) {
      const size_t x = item.find('x', start);
      dims.push_back(parse_size(flag, item.substr(start, x == std::string::npos ? std::string::npos : x - start)));
      if (x == std::string::npos) break;
      start = x + 1;
    }
    if (dims.size() == 3) gemm.push_back({dims[0], dims[1], dims[2]});
    else if (dims.size() == 6) attention.push_back({dims[0], dims[1], dims[2], dims[3], dims[4], dims[5]});
    else
      throw UsageError(flag + ": expected MxNxK (matmul, e.g. 4096x4096x4096) or BxSQxSKxHQxHKxD (attention, e.g. "
                       "1x1x32768x32x8x128), got '" + item + "'");
  }
}

std::vector<std::string> tunable_ops() {
  std::vector<std::string> names;
  for (const auto& t : kTunableOps) names.push_back(t.name);
  return names;
}

std::vector<const ops::OpInfo*> resolve_ops(const std::vector<std::string>& names) {
  std::vector<const ops::OpInfo*> selected;
  for (const auto& op : ops::all_ops()) {
    bool wanted = names.empty();
    for (const auto& name : names)
      for (const ops::OpInfo* s : ops::select_ops(name)) wanted = wanted || s == &op;
    if (wanted) selected.push_back(&op);
  }
  return selected;
}

std::vector<BenchItem> bench_plan(const Args& a) {
  // profile names exactly one op; bench and verify take each name with its variants.
  std::vector<const ops::OpInfo*> selected =
      a.verb == Verb::profile ? std::vector<const ops::OpInfo*>{ops::find_op(a.ops.at(0))}
                              : resolve_ops(a.ops);

  std::vector<BenchItem> plan;
  for (const ops::OpInfo* op : selected) {
    if (!op) throw UsageError("unknown op (known: " + op_names() + ")");
    std::vector<DType> dtypes = a.dtypes.empty() ? op->dtypes : a.dtypes;
    std::vector<int64_t> sizes = a.sizes.empty() ? op->bench_sizes : a.sizes;
    if (a.quick && a.sizes.empty() && sizes.size() > 3) {
      std::vector<int64_t> sorted = sizes;
      std::sort(sorted.begin(), sorted.end());
      sizes = {sorted.front(), sorted[sorted.size() / 2], sorted.back()};
    }
    if (a.verb == Verb::profile) {
      if (dtypes.empty() || sizes.empty())
        throw UsageError("profile: op '" + op->name + "' declares no default dtype or size");
      dtypes.resize(1);
      sizes = {a.sizes.empty() ? *std::max_element(sizes.begin(), sizes.end()) : sizes.front()};
    }
    for (DType dtype : dtypes) {
      if (!supports(*op, dtype)) {
        // "every op", or a variant the name pulled in (isin -> isin_bitmap): bench the ones that
        // have this dtype. An op named exactly must support it.
        if (a.ops.empty() || std::find(a.ops.begin(), a.ops.end(), op->name) == a.ops.end()) continue;
        throw UsageError("op '" + op->name + "' does not support dtype " + dtype_name(dtype) +
                         " (supported: " + dtype_list(op->dtypes) + ")");
      }
      for (int64_t size : sizes) plan.push_back({op, dtype, size});
    }
  }
  if (plan.empty())
    throw UsageError("no selected op supports dtype " + dtype_list(a.dtypes) +
                     " (supported: " + dtypes_by_op(selected) + ")");
  return plan;
}

std::string usage(Verb verb) {
  std::string text;
  if (verb == Verb::help) {
    text = "usage: tessera VERB [options]   ('tessera help VERB' for a verb's options)\n"
           "       tessera --version\n\nverbs:\n";
    for (const auto& s : verb_specs())
      text += "  " + std::string(s.name) + std::string(10 - std::string(s.name).size(), ' ') +
              s.summary + "\n";
    return text + "\nops: " + op_names() + "\n";
  }
  const VerbSpec& spec = spec_of(verb);
  text = "usage: tessera " + std::string(spec.name) + (*spec.operands ? " " : "") + spec.operands +
         " [options]\n\n" + spec.summary + "\n";
  if (verb == Verb::tune) text += "ops (those with configs):\n" + tunable_op_lines();
  else if (*spec.operands) text += "ops: " + op_names() + "\n";
  text += "\noptions:\n";
  auto line = [&](std::string left, const std::string& help) {
    left.resize(std::max<size_t>(left.size() + 2, 18), ' ');
    text += "  " + left + help + "\n";
  };
  for (const auto& o : spec.options)
    line(std::string(o.name) + (o.metavar ? std::string(" ") + o.metavar : ""), o.help);
  line("-h, --help", "show this help");
  if (verb == Verb::bench || verb == Verb::profile)
    text += "\nwhat a size means, per family (and the shape a size gives):\n" + size_meanings() +
            "\ndtypes, per op:\n" + dtype_lines();
  return text;
}

}  // namespace tessera::cli
