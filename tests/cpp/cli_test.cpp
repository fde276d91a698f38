// The `tessera` command line: parsing, planning and exit codes. CPU-only except run_cli, which
// must fail cleanly (not crash) where there is no GPU.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "cli.hpp"
#include "ops/registry.hpp"
#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "runtime/tune_cache.hpp"
#include "tessera/version.hpp"

namespace tessera::cli {
namespace {

Args parse(std::vector<std::string> args) {
  args.insert(args.begin(), "tessera");
  return parse_args(args);
}

// The message of the UsageError that parsing `args` must throw.
std::string usage_error(std::vector<std::string> args) {
  try {
    parse(args);
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UsageError";
  return "";
}

std::string size_error(const std::string& text) {
  try {
    parse_size("--sizes", text);
  } catch (const UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UsageError for '" << text << "'";
  return "";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(CliSize, AcceptsPlainPowersAndSuffixes) {
  EXPECT_EQ(parse_size("--sizes", "1048576"), 1048576);
  EXPECT_EQ(parse_size("--sizes", "1"), 1);
  EXPECT_EQ(parse_size("--sizes", "2^20"), int64_t{1} << 20);
  EXPECT_EQ(parse_size("--sizes", "2^0"), 1);
  EXPECT_EQ(parse_size("--sizes", "2^62"), int64_t{1} << 62);
  EXPECT_EQ(parse_size("--sizes", "4k"), 4096);
  EXPECT_EQ(parse_size("--sizes", "4K"), 4096);
  EXPECT_EQ(parse_size("--sizes", "1M"), 1 << 20);
  EXPECT_EQ(parse_size("--sizes", "3G"), int64_t{3} << 30);
  EXPECT_EQ(parse_sizes("--sizes", "2^16,2^20,1048576,4k"),
            (std::vector<int64_t>{1 << 16, 1 << 20, 1048576, 4096}));
}

TEST(CliSize, RejectsBadValuesNamingFlagAndValue) {
  for (const char* bad : {"2^", "-5", "abc", "", "1.5", "k", "2^x", "4KB", "1m", " 4", "2^-1",
                          "0", "2^63", "99999999999999999999", "9000000000G"}) {
    std::string msg = size_error(bad);
    EXPECT_TRUE(contains(msg, "--sizes")) << msg;
    EXPECT_TRUE(contains(msg, "'" + std::string(bad) + "'")) << msg;
  }
  std::string msg;
  try {
    parse_sizes("--sizes", "2^20,,4k");
  } catch (const UsageError& e) {
    msg = e.what();
  }
  EXPECT_TRUE(contains(msg, "--sizes") && contains(msg, "2^20,,4k")) << msg;
}

TEST(CliSize, FormatsPowersOfTwo) {
  EXPECT_EQ(format_size(1 << 20), "2^20");
  EXPECT_EQ(format_size(1000), "1000");
  EXPECT_EQ(format_size(512), "512");
  EXPECT_EQ(format_size(3 << 20), "3145728");
}

TEST(CliDtype, TorchNamesAndShortForms) {
  EXPECT_EQ(parse_dtype("--dtype", "float32"), DType::float32);
  EXPECT_EQ(parse_dtype("--dtype", "fp32"), DType::float32);
  EXPECT_EQ(parse_dtype("--dtype", "float16"), DType::float16);
  EXPECT_EQ(parse_dtype("--dtype", "fp16"), DType::float16);
  EXPECT_EQ(parse_dtype("--dtype", "bfloat16"), DType::bfloat16);
  EXPECT_EQ(parse_dtype("--dtype", "bf16"), DType::bfloat16);
  EXPECT_EQ(parse_dtype("--dtype", "torch.bfloat16"), DType::bfloat16);
  EXPECT_EQ(parse_dtype("--dtype", "int32"), DType::int32);
  EXPECT_EQ(parse_dtypes("--dtype", "float32,bf16"),
            (std::vector<DType>{DType::float32, DType::bfloat16}));
  for (const char* bad : {"f32", "BF16", "", "bfloat"}) {
    try {
      parse_dtype("--dtype", bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const UsageError& e) {
      EXPECT_TRUE(contains(e.what(), "--dtype") && contains(e.what(), "'" + std::string(bad) + "'"))
          << e.what();
    }
  }
}

TEST(CliVerb, HelpForms) {
  for (auto args : {std::vector<std::string>{"--help"}, {"-h"}, {"help"}}) {
    Args a = parse(args);
    EXPECT_TRUE(a.help);
    EXPECT_EQ(a.verb, Verb::help);
  }
  Args a = parse({"help", "bench"});
  EXPECT_TRUE(a.help);
  EXPECT_EQ(a.verb, Verb::bench);
  for (const char* verb : {"info", "verify", "bench", "profile"}) {
    a = parse({verb, "--help"});
    EXPECT_TRUE(a.help);
    EXPECT_EQ(verb_name(a.verb), verb);
  }
  // --help wins over a bad value earlier on the line.
  EXPECT_TRUE(parse({"bench", "--sizes", "abc", "--help"}).help);
  EXPECT_TRUE(contains(usage_error({"help", "frobnicate"}), "frobnicate"));
}

TEST(CliVerb, UsageTexts) {
  std::string list = usage(Verb::help);
  for (const char* verb : {"info", "verify", "bench", "profile"}) EXPECT_TRUE(contains(list, verb));
  EXPECT_TRUE(contains(list, "gelu_backward"));
  std::string bench = usage(Verb::bench);
  for (const char* flag : {"--dtype", "--sizes", "--out", "--reps", "--graph", "--no-flush",
                           "--no-peaks", "--device", "--help"})
    EXPECT_TRUE(contains(bench, flag)) << flag;
  EXPECT_TRUE(contains(usage(Verb::verify), "--large"));
  EXPECT_TRUE(contains(usage(Verb::info), "--no-peaks"));
  EXPECT_TRUE(contains(usage(Verb::profile), "--size"));
}

// What run_cli prints: (exit status, stdout, stderr).
struct CliRun {
  int rc;
  std::string out, err;
};
CliRun run(std::vector<std::string> args) {
  args.insert(args.begin(), "tessera");
  std::ostringstream out, err;
  int rc = run_cli(args, out, err);
  return {rc, out.str(), err.str()};
}

TEST(CliVerb, Version) {
  EXPECT_TRUE(parse({"--version"}).version);
  CliRun r = run({"--version"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, std::string("tessera ") + kVersion + "\n");
  EXPECT_TRUE(contains(usage_error({"--version", "bench"}), "'bench'"));
  EXPECT_TRUE(contains(usage(Verb::help), "--version"));
}

// The version the header states is the CMake project's.
TEST(CliVerb, VersionMatchesCMakeProject) {
  namespace fs = std::filesystem;
  const fs::path cmake = fs::path(__FILE__).parent_path().parent_path().parent_path() / "CMakeLists.txt";
  std::ifstream in(cmake);
  if (!in) GTEST_SKIP() << "source tree not found at " << cmake;
  std::stringstream text;
  text << in.rdbuf();
  std::smatch m;
  const std::string s = text.str();
  ASSERT_TRUE(std::regex_search(s, m, std::regex(R"(project\(tessera\s+VERSION\s+([0-9.]+))")));
  EXPECT_EQ(m[1].str(), kVersion);
}

TEST(CliVerb, HelpVerbIsVerbHelp) {
  for (const char* verb : {"info", "verify", "bench", "profile"}) {
    CliRun help = run({"help", verb}), flag = run({verb, "--help"});
    EXPECT_EQ(help.rc, 0) << help.err;
    EXPECT_EQ(help.out, flag.out) << verb;
    EXPECT_TRUE(contains(help.out, std::string("usage: tessera ") + verb)) << help.out;
  }
  for (auto args : {std::vector<std::string>{"help", "--help"}, {"help", "-h"}, {"help", "help"}}) {
    CliRun r = run(args);
    EXPECT_EQ(r.rc, 0) << args.back() << ": " << r.err;
    EXPECT_EQ(r.out, usage(Verb::help)) << args.back();
  }
  CliRun bad = run({"help", "frobnicate"});
  EXPECT_EQ(bad.rc, 2);
  EXPECT_TRUE(contains(bad.err, "'frobnicate'") && contains(bad.err, "info, verify, bench, profile"))
      << bad.err;
}

TEST(CliVerb, BenchHelpSaysWhatASizeMeansPerFamily) {
  for (Verb verb : {Verb::bench, Verb::profile}) {
    const std::string text = usage(verb);
    for (const auto& op : ops::all_ops()) {
      EXPECT_TRUE(contains(text, op.size_meaning)) << op.name << ": " << op.size_meaning;
      EXPECT_TRUE(contains(text, "  " + op.family + " ")) << op.family;
      EXPECT_TRUE(contains(text, op.name)) << op.name;
    }
    EXPECT_FALSE(contains(text, "sizes in elements")) << text;
  }
}

// Each line of the bench help's "what a size means": (its label, the meaning after the padding).
std::vector<std::pair<std::string, std::string>> size_lines(const std::string& help) {
  std::vector<std::pair<std::string, std::string>> lines;
  std::istringstream in(help.substr(help.find("what a size means")));
  std::string line;
  std::getline(in, line);  // the heading
  while (std::getline(in, line) && !line.empty()) {
    const size_t gap = line.find("  ", 2);  // labels hold single spaces only
    lines.push_back({line.substr(2, gap - 2), line.substr(line.find_first_not_of(' ', gap))});
  }
  return lines;
}

// "loss (cross_entropy, x)" names cross_entropy and x, not linear_cross_entropy.
bool label_names(const std::string& label, const std::string& op) {
  const size_t open = label.find(" (");
  if (open == std::string::npos || label.back() != ')') return false;
  std::istringstream names(label.substr(open + 2, label.size() - open - 3));
  for (std::string name; std::getline(names >> std::ws, name, ',');)
    if (name == op) return true;
  return false;
}

// A family whose ops mean different things by a size gets a line per meaning, each naming its
// ops; a family with one meaning is labelled by its name alone.
TEST(CliVerb, BenchHelpTellsApartTheSizeMeaningsOfOneFamily) {
  const auto lines = size_lines(usage(Verb::bench));
  std::set<std::string> labels;
  for (const auto& line : lines) EXPECT_TRUE(labels.insert(line.first).second) << line.first;
  for (const auto& op : ops::all_ops()) {
    const auto line = std::find_if(lines.begin(), lines.end(), [&](const auto& l) {
      return l.first.starts_with(op.family) && l.second.starts_with(op.size_meaning);
    });
    ASSERT_NE(line, lines.end()) << op.name;
    const bool shared = std::any_of(ops::all_ops().begin(), ops::all_ops().end(), [&](const auto& o) {
      return o.family == op.family && o.size_meaning != op.size_meaning;
    });
    if (shared) EXPECT_TRUE(label_names(line->first, op.name)) << op.name << ": " << line->first;
    else EXPECT_EQ(line->first, op.family) << op.name;
  }
}

TEST(CliVerb, UnknownOrMissingVerb) {
  EXPECT_TRUE(contains(usage_error({}), "no verb"));
  std::string msg = usage_error({"frobnicate"});
  EXPECT_TRUE(contains(msg, "frobnicate") && contains(msg, "bench")) << msg;
}

TEST(CliInfo, Flags) {
  Args a = parse({"info"});
  EXPECT_EQ(a.verb, Verb::info);
  EXPECT_EQ(a.device, 0);
  EXPECT_TRUE(a.peaks);
  a = parse({"info", "--no-peaks", "--device", "3"});
  EXPECT_FALSE(a.peaks);
  EXPECT_EQ(a.device, 3);
  EXPECT_EQ(parse({"info", "--device=1"}).device, 1);
  EXPECT_TRUE(contains(usage_error({"info", "add"}), "'add'"));
  EXPECT_TRUE(contains(usage_error({"info", "--large"}), "--large"));  // verify's flag, not info's
  std::string msg = usage_error({"info", "--device", "-1"});
  EXPECT_TRUE(contains(msg, "--device") && contains(msg, "'-1'")) << msg;
  EXPECT_TRUE(contains(usage_error({"info", "--device", "x"}), "'x'"));
  EXPECT_TRUE(contains(usage_error({"info", "--device"}), "needs a value"));
  EXPECT_TRUE(contains(usage_error({"info", "--no-peaks=1"}), "takes no value"));
}

TEST(CliVerify, OpsAndFlags) {
  Args a = parse({"verify"});
  EXPECT_EQ(a.verb, Verb::verify);
  EXPECT_TRUE(a.ops.empty());
  EXPECT_FALSE(a.large);
  a = parse({"verify", "add", "gelu", "--large", "--device", "1"});
  EXPECT_EQ(a.ops, (std::vector<std::string>{"add", "gelu"}));
  EXPECT_TRUE(a.large);
  EXPECT_EQ(a.device, 1);
  EXPECT_EQ(a.seed, 0);
  EXPECT_EQ(parse({"verify", "--seed", "7"}).seed, 7);
  EXPECT_TRUE(contains(usage_error({"verify", "--seed", "-1"}), "--seed")) << "a seed is >= 0";
  std::string msg = usage_error({"verify", "add", "nope"});
  EXPECT_TRUE(contains(msg, "'nope'") && contains(msg, "gelu_backward")) << msg;
  msg = usage_error({"verify", "--fast"});
  EXPECT_TRUE(contains(msg, "unknown option") && contains(msg, "--fast")) << msg;
}

// --quick: an op's smallest, a middle and its largest bench size; --sizes wins over it.
TEST(CliBench, Quick) {
  const auto sizes_of = [](const std::vector<BenchItem>& plan) {
    std::vector<int64_t> s;
    for (const auto& item : plan) s.push_back(item.size);
    return s;
  };
  const auto* add = tessera::ops::find_op("add");
  ASSERT_NE(add, nullptr);
  ASSERT_GT(add->bench_sizes.size(), 3u);
  std::vector<int64_t> want = add->bench_sizes;
  std::sort(want.begin(), want.end());
  want = {want.front(), want[want.size() / 2], want.back()};
  EXPECT_EQ(sizes_of(bench_plan(parse({"bench", "add", "--dtype", "float32", "--quick"}))), want);
  EXPECT_EQ(sizes_of(bench_plan(parse({"bench", "add", "--dtype", "float32", "--quick", "--sizes", "1k"}))),
            (std::vector<int64_t>{1024}));
}

TEST(CliBench, Flags) {
  Args a = parse({"bench", "add", "gelu_backward", "--dtype", "float32,bf16", "--sizes",
                  "2^16,1M", "--out", "/tmp/x", "--reps", "50", "--graph", "--no-flush",
                  "--no-peaks", "--device", "2"});
  EXPECT_EQ(a.verb, Verb::bench);
  EXPECT_EQ(a.ops, (std::vector<std::string>{"add", "gelu_backward"}));
  EXPECT_EQ(a.dtypes, (std::vector<DType>{DType::float32, DType::bfloat16}));
  EXPECT_EQ(a.sizes, (std::vector<int64_t>{1 << 16, 1 << 20}));
  EXPECT_EQ(a.out_dir, "/tmp/x");
  EXPECT_EQ(a.reps, 50);
  EXPECT_TRUE(a.graph);
  EXPECT_FALSE(a.flush_l2);
  EXPECT_FALSE(a.peaks);
  EXPECT_EQ(a.device, 2);

  a = parse({"bench"});
  EXPECT_TRUE(a.ops.empty() && a.dtypes.empty() && a.sizes.empty() && a.out_dir.empty());
  EXPECT_EQ(a.reps, 0);
  EXPECT_FALSE(a.graph);
  EXPECT_TRUE(a.flush_l2 && a.peaks);

  // Repeated list flags add up; "=" works too.
  a = parse({"bench", "--sizes=4k", "--sizes", "2^10", "--dtype=fp16", "--dtype", "fp32"});
  EXPECT_EQ(a.sizes, (std::vector<int64_t>{4096, 1024}));
  EXPECT_EQ(a.dtypes, (std::vector<DType>{DType::float16, DType::float32}));

  std::string msg = usage_error({"bench", "--sizes", "2^"});
  EXPECT_TRUE(contains(msg, "--sizes") && contains(msg, "'2^'")) << msg;
  msg = usage_error({"bench", "--sizes", "-5"});
  EXPECT_TRUE(contains(msg, "--sizes") && contains(msg, "'-5'")) << msg;
  msg = usage_error({"bench", "--dtype", "fp8x"});
  EXPECT_TRUE(contains(msg, "--dtype") && contains(msg, "'fp8x'")) << msg;
  msg = usage_error({"bench", "--reps", "0"});
  EXPECT_TRUE(contains(msg, "--reps") && contains(msg, "'0'")) << msg;
  EXPECT_TRUE(contains(usage_error({"bench", "--dtype"}), "--dtype needs a value"));
  EXPECT_TRUE(contains(usage_error({"bench", "--out", "--graph"}), "--out needs a value"));
  EXPECT_TRUE(contains(usage_error({"bench", "--size", "4k"}), "unknown option '--size'"));
  EXPECT_TRUE(contains(usage_error({"bench", "softmax_typo"}), "softmax_typo"));
}

TEST(CliProfile, Flags) {
  Args a = parse({"profile", "gelu", "--dtype", "bf16", "--size", "2^20", "--device", "1"});
  EXPECT_EQ(a.verb, Verb::profile);
  EXPECT_EQ(a.ops, std::vector<std::string>{"gelu"});
  EXPECT_EQ(a.dtypes, std::vector<DType>{DType::bfloat16});
  EXPECT_EQ(a.sizes, std::vector<int64_t>{1 << 20});
  EXPECT_EQ(a.device, 1);
  EXPECT_TRUE(contains(usage_error({"profile"}), "one OP"));
  EXPECT_TRUE(contains(usage_error({"profile", "add", "gelu"}), "one OP"));
  EXPECT_TRUE(contains(usage_error({"profile", "add", "--sizes", "4k"}), "--sizes"));
  std::string msg = usage_error({"profile", "add", "--size", "abc"});
  EXPECT_TRUE(contains(msg, "--size") && contains(msg, "'abc'")) << msg;
  // One dtype, not a list.
  EXPECT_TRUE(contains(usage_error({"profile", "add", "--dtype", "fp32,bf16"}), "'fp32,bf16'"));
}

TEST(CliTune, ShapesLayoutsAndShow) {
  Args a = parse({"tune", "gemm", "--shapes", "4096x4096x4096,16x14336x4k", "--dtype", "bf16,fp16",
                  "--layout", "nt,nn"});
  EXPECT_EQ(a.verb, Verb::tune);
  EXPECT_EQ(a.ops, std::vector<std::string>{"matmul"});  // gemm is matmul's alias here
  ASSERT_EQ(a.shapes.size(), 2u);
  EXPECT_EQ(a.shapes[1].m, 16);
  EXPECT_EQ(a.shapes[1].n, 14336);
  EXPECT_EQ(a.shapes[1].k, 4096);
  EXPECT_EQ(a.dtypes, (std::vector<DType>{DType::bfloat16, DType::float16}));
  EXPECT_EQ(a.layouts, (std::vector<std::string>{"nt", "nn"}));
  EXPECT_TRUE(parse({"tune", "--show"}).show);
  EXPECT_TRUE(contains(usage_error({"tune", "matmul"}), "expected --shapes"));
  EXPECT_TRUE(contains(usage_error({"tune", "softmax", "--show"}), "ops with configs: matmul"));
  EXPECT_TRUE(contains(usage_error({"tune", "matmul", "--shapes", "64x64"}), "expected MxNxK"));
  EXPECT_TRUE(contains(usage_error({"tune", "matmul", "--shapes", "64x0x64"}), "positive"));
  EXPECT_TRUE(contains(usage_error({"tune", "matmul", "--shapes", "64x64x64", "--layout", "xy"}),
                       "expected nn, nt, tn or tt"));
}

// attention's shapes have six dimensions; each item goes to the op its arity names.
TEST(CliTune, AttentionShapes) {
  Args a = parse({"tune", "attention", "matmul", "--shapes", "1x1x32kx32x8x128,64x64x64"});
  EXPECT_EQ(a.ops, (std::vector<std::string>{"attention", "matmul"}));
  ASSERT_EQ(a.attention_shapes.size(), 1u);
  EXPECT_EQ(a.attention_shapes[0].seq_k, 32768);
  EXPECT_EQ(a.attention_shapes[0].heads_kv, 8);
  EXPECT_EQ(a.attention_shapes[0].head_dim, 128);
  ASSERT_EQ(a.shapes.size(), 1u);
  EXPECT_TRUE(contains(usage_error({"tune", "matmul", "--shapes", "1x1x64x2x2x64"}), "attention is not among"));
  EXPECT_TRUE(contains(usage_error({"tune", "attention", "--shapes", "64x64x64"}), "matmul is not among"));
  EXPECT_TRUE(contains(usage_error({"tune", "attention", "--shapes", "1x1x64x2x64"}), "BxSQxSKxHQxHKxD"));
}

// tune takes only the ops with configs: its --help lists those and no other op.
TEST(CliTune, HelpListsOnlyTheOpsWithConfigs) {
  const std::vector<std::string> tunable = tunable_ops();
  ASSERT_FALSE(tunable.empty());
  for (const auto& name : tunable) EXPECT_NE(ops::find_op(name), nullptr) << name;
  const CliRun help = run({"tune", "--help"});
  EXPECT_EQ(help.rc, 0) << help.err;
  EXPECT_EQ(help.out, usage(Verb::tune));
  for (const auto& op : ops::all_ops()) {
    const bool is_tunable = std::find(tunable.begin(), tunable.end(), op.name) != tunable.end();
    EXPECT_EQ(contains(help.out, op.name), is_tunable) << op.name << " in:\n" << help.out;
  }
  EXPECT_TRUE(contains(help.out, "alias gemm")) << help.out;
}

// An op without configs, or no op at all: the error names the argument and the ops with configs.
TEST(CliTune, OtherOpsAreRefusedNamingTheTunableOnes) {
  const std::string add = usage_error({"tune", "add", "--shapes", "64x64x64"});
  EXPECT_TRUE(contains(add, "tune: op 'add' has no configs to tune")) << add;
  const std::string typo = usage_error({"tune", "matmull", "--shapes", "64x64x64"});
  EXPECT_TRUE(contains(typo, "tune: unknown op 'matmull'")) << typo;
  for (const auto& msg : {add, typo}) {
    EXPECT_TRUE(contains(msg, "ops with configs: ")) << msg;
    for (const auto& name : tunable_ops()) EXPECT_TRUE(contains(msg, name)) << msg;
    EXPECT_FALSE(contains(msg, "softmax")) << msg;
  }
  EXPECT_EQ(parse({"tune", "gemm", "attention", "--show"}).ops,
            (std::vector<std::string>{"matmul", "attention"}));
}

// Sets an environment variable for its lifetime.
class EnvVar {
 public:
  EnvVar(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~EnvVar() { old_ ? ::setenv(name_, old_->c_str(), 1) : ::unsetenv(name_); }
  EnvVar(const EnvVar&) = delete;
  EnvVar& operator=(const EnvVar&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// --show reads the cache file only: it needs no GPU, names the file, and says when it is absent.
TEST(CliTune, ShowListsTheCacheFileWithoutAGpu) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("tessera_cli_show_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const EnvVar cache_dir("TESSERA_CACHE_DIR", dir.string());
  const std::string path = (dir / "tune.cache").string();

  const CliRun absent = run({"tune", "--show"});
  EXPECT_EQ(absent.rc, 0) << absent.err;
  EXPECT_EQ(absent.out, "tune cache: " + path + " (absent: nothing tuned yet)\n");

  // Another machine's record, written without a GPU.
  runtime::TuneCache(path, {"Other GPU", 132, 13000, 13000, "0.0.9"})
      .put("matmul", "sm90|bf16|NT|m64", {"bn=128", 12.5});
  const CliRun shown = run({"tune", "--show"});
  EXPECT_EQ(shown.rc, 0) << shown.err;
  EXPECT_EQ(shown.out.rfind("tune cache: " + path + "\n", 0), 0u) << shown.out;
  EXPECT_TRUE(contains(shown.out, "  matmul  sm90|bf16|NT|m64  bn=128  12.5 us  (Other GPU, 132 SMs, "
                                  "driver 13.0, runtime 13.0, tessera 0.0.9)\n"))
      << shown.out;
  EXPECT_TRUE(contains(shown.out, "1 record(s)")) << shown.out;
  fs::remove_all(dir);
}

// An unknown dtype: the error names the dtypes each selected op takes, not a fixed list.
TEST(CliDtype, UnknownDtypeNamesWhatTheOpsTake) {
  std::string isin = usage_error({"bench", "isin", "--dtype", "fp8x"});
  EXPECT_TRUE(contains(isin, "--dtype") && contains(isin, "'fp8x'")) << isin;
  for (const char* dtype : {"int32", "int64", "uint8", "float64", "bfloat16"})
    EXPECT_TRUE(contains(isin, dtype)) << dtype << ": " << isin;
  EXPECT_TRUE(contains(isin, "isin_bitmap: int8, int16, uint8, float16, bfloat16")) << isin;
  EXPECT_FALSE(contains(isin, "gelu")) << isin;

  std::string gelu = usage_error({"bench", "gelu", "--dtype", "int"});
  EXPECT_TRUE(contains(gelu, "gelu, gelu_backward") && contains(gelu, "float32, float16, bfloat16"))
      << gelu;
  EXPECT_TRUE(contains(gelu, "; the selected ops take gelu,")) << gelu;

  // Ops named after --dtype count too; profile takes its one op by exact name.
  std::string late = usage_error({"profile", "--dtype", "x", "isin_bitmap"});
  EXPECT_TRUE(contains(late, "isin_bitmap: int8, int16, uint8, float16, bfloat16")) << late;
  EXPECT_FALSE(contains(late, "isin_hash")) << late;
  EXPECT_EQ(parse({"bench", "isin", "--dtype", "int32,fp16"}).dtypes,
            (std::vector<DType>{DType::int32, DType::float16}));
}

TEST(CliPlan, BenchDefaultsComeFromTheRegistry) {
  const ops::OpInfo* add = ops::find_op("add");
  ASSERT_NE(add, nullptr);
  std::vector<BenchItem> plan = bench_plan(parse({"bench", "add"}));
  ASSERT_EQ(plan.size(), add->dtypes.size() * add->bench_sizes.size());
  EXPECT_EQ(plan.front().op, add);
  EXPECT_EQ(plan.front().dtype, add->dtypes.front());
  EXPECT_EQ(plan.front().size, add->bench_sizes.front());

  plan = bench_plan(parse({"bench", "add", "gelu", "--dtype", "fp32", "--sizes", "4k,2^20"}));
  // "gelu" brings its variants: gelu, gelu_backward, gelu_tanh, gelu_tanh_backward.
  ASSERT_EQ(plan.size(), 10u);
  EXPECT_EQ(plan[1].op->name, "add");
  EXPECT_EQ(plan[4].op->name, "gelu_backward");
  EXPECT_EQ(plan[1].size, 1 << 20);
  EXPECT_EQ(plan[2].op->name, "gelu");
  EXPECT_EQ(plan[2].dtype, DType::float32);

  size_t every = 0;
  for (const auto& op : ops::all_ops()) every += op.dtypes.size() * op.bench_sizes.size();
  EXPECT_EQ(bench_plan(parse({"bench"})).size(), every);
}

TEST(CliPlan, UnsupportedDtypeNamesOpAndDtype) {
  // int64 is a DType but no elementwise op computes in it.
  std::string msg;
  try {
    bench_plan(parse({"bench", "gelu", "--dtype", "int64"}));
  } catch (const UsageError& e) {
    msg = e.what();
  }
  EXPECT_TRUE(contains(msg, "gelu") && contains(msg, "int64")) << msg;
  // Over all ops int64 is fine (isin takes it); over ops that lack it, it is refused.
  EXPECT_THROW(bench_plan(parse({"bench", "add", "softmax", "--dtype", "int64"})), UsageError);
  EXPECT_THROW(bench_plan(parse({"profile", "add", "--dtype", "int64"})), UsageError);
}

TEST(CliPlan, ProfileDefaultsToFirstDtypeAndLargestSize) {
  const ops::OpInfo* gelu = ops::find_op("gelu");
  ASSERT_NE(gelu, nullptr);
  std::vector<BenchItem> plan = bench_plan(parse({"profile", "gelu"}));
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].dtype, gelu->dtypes.front());
  EXPECT_EQ(plan[0].size, *std::max_element(gelu->bench_sizes.begin(), gelu->bench_sizes.end()));
  plan = bench_plan(parse({"profile", "gelu", "--dtype", "bf16", "--size", "1k"}));
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].dtype, DType::bfloat16);
  EXPECT_EQ(plan[0].size, 1024);
}

TEST(CliRun, ExitCodes) {
  std::ostringstream out, err;
  EXPECT_EQ(run_cli({"tessera", "--help"}, out, err), 0);
  EXPECT_TRUE(contains(out.str(), "verify"));
  EXPECT_EQ(run_cli({"tessera", "bench", "--help"}, out, err), 0);
  EXPECT_TRUE(contains(out.str(), "--sizes"));

  // Usage errors: exit 2, one line starting "tessera: ", whether or not there is a GPU.
  for (std::vector<std::string> bad :
       {std::vector<std::string>{"tessera"}, {"tessera", "nope"}, {"tessera", "bench", "--bogus"},
        {"tessera", "bench", "--sizes", "2^"}, {"tessera", "verify", "nope"},
        {"tessera", "bench", "add", "--dtype", "int64"}}) {
    std::ostringstream o, e;
    EXPECT_EQ(run_cli(bad, o, e), 2) << bad.back();
    const std::string msg = e.str();
    EXPECT_EQ(msg.rfind("tessera: ", 0), 0u) << msg;
    EXPECT_EQ(std::count(msg.begin(), msg.end(), '\n'), 1) << msg;
  }
}

TEST(CliRun, GpuVerbsFailCleanlyWithoutGpu) {
  std::ostringstream out, err;
  int rc = run_cli({"tessera", "info", "--no-peaks"}, out, err);
  if (runtime::device_count() == 0) {
    EXPECT_EQ(rc, 1);
    EXPECT_TRUE(contains(err.str(), "tessera: info needs a GPU: " + runtime::no_gpu_reason()))
        << err.str();
  } else {
    EXPECT_EQ(rc, 0) << err.str();
    EXPECT_TRUE(contains(out.str(), "compute capability"));
  }

  if (runtime::device_count() > 0) GTEST_SKIP() << "a GPU is present: verify would run every case";
  std::ostringstream vout, verr;
  EXPECT_EQ(run_cli({"tessera", "verify"}, vout, verr), 1);
  EXPECT_EQ(verr.str().rfind("tessera: verify needs a GPU", 0), 0u) << verr.str();
}

TEST(CliRun, DeviceOutOfRangeIsAUsageError) {
  int count = runtime::device_count();
  if (count == 0) GTEST_SKIP() << runtime::no_gpu_reason();
  std::ostringstream out, err;
  EXPECT_EQ(run_cli({"tessera", "info", "--no-peaks", "--device", std::to_string(count)}, out, err),
            2);
  EXPECT_TRUE(contains(err.str(), "--device")) << err.str();
}

}  // namespace
}  // namespace tessera::cli

namespace tessera {
namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

bool driver_library_present() {
  return dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD) || dlopen("libcuda.so.1", RTLD_LAZY);
}

// The message of the tessera::Error that a failing CUDA call raises through TESSERA_CUDA_CHECK.
std::string cuda_check_error() {
  cudaDeviceProp p{};
  try {
    TESSERA_CUDA_CHECK(cudaGetDeviceProperties(&p, -1));  // fails with or without a GPU
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "cudaGetDeviceProperties(-1) succeeded";
  return "";
}

TEST(CliErrors, SourcePathsAreRelativeToTheSourceRoot) {
  static_assert(std::string_view(detail::source_path("/elsewhere/src/x/y.cpp")) == "y.cpp");
  static_assert(std::string_view(detail::source_path("src/bench/peaks.cpp")) == "src/bench/peaks.cpp");
  const std::string root(detail::source_root());
  ASSERT_FALSE(root.empty()) << "check.hpp's __FILE__ does not end in src/runtime/check.hpp";
  EXPECT_STREQ(detail::source_path((root + "src/bench/peaks.cpp").c_str()), "src/bench/peaks.cpp");
  EXPECT_STREQ(detail::source_path(__FILE__), "tests/cpp/cli_test.cpp");
}

TEST(CliErrors, CudaErrorsCarryNoBuildPath) {
  const std::string msg = cuda_check_error();
  EXPECT_TRUE(contains(msg, "cudaGetDeviceProperties") && contains(msg, "tests/cpp/cli_test.cpp:"))
      << msg;
  const std::string root(detail::source_root());
  if (root.starts_with("/")) {
    EXPECT_FALSE(contains(msg, root)) << msg;
  }
  EXPECT_FALSE(contains(msg, "\n")) << msg;
  if (runtime::device_count() == 0) {
    EXPECT_TRUE(contains(msg, runtime::no_gpu_reason())) << msg;
  }
}

TEST(CliErrors, NoGpuReasonNamesTheMissingDriver) {
  if (runtime::device_count() > 0) {
    EXPECT_EQ(runtime::no_gpu_reason(), "");
    GTEST_SKIP() << "a GPU is present: there is no reason to give";
  }
  const std::string reason = runtime::no_gpu_reason();
  EXPECT_FALSE(reason.empty());
  EXPECT_FALSE(contains(reason, "insufficient")) << reason;  // the runtime's own, misleading words
  if (!driver_library_present()) {
    EXPECT_EQ(reason, "no NVIDIA driver found (libcuda.so.1 could not be loaded)");
  }
}

}  // namespace
}  // namespace tessera
