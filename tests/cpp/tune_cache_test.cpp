// The autotuner's on-disk cache: round trips, what it refuses to trust, concurrent writers and the
// default path. No GPU needed except in CurrentIdentity, which checks either outcome.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/device.hpp"
#include "runtime/tune_cache.hpp"
#include "tessera/error.hpp"
#include "tessera/version.hpp"

namespace fs = std::filesystem;
using tessera::runtime::TuneCache;
using tessera::runtime::TuneEntry;
using tessera::runtime::TuneIdentity;

namespace {

TuneIdentity h200() { return {"NVIDIA H200", 132, 12080, 12080, "0.1.0"}; }

const std::string kKey = "sm90|bf16,bf16->bf16|NT|m4096-n4096-k4096";

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

// The config find() returns, "<none>" where it returns nothing.
std::string config(const TuneCache& cache, const std::string& op, const std::string& key) {
  const auto e = cache.find(op, key);
  return e ? e->config : "<none>";
}
double time_us(const TuneCache& cache, const std::string& op, const std::string& key) {
  const auto e = cache.find(op, key);
  return e ? e->time_us : -1;
}

std::size_t lines_starting(const std::string& text, const std::string& start) {
  std::size_t n = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) n += line.rfind(start, 0) == 0;
  return n;
}

// A fresh directory per test, removed afterwards.
class TuneCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "_" + info->name();
    for (char& c : name)
      if (c == '/') c = '_';
    dir_ = fs::temp_directory_path() / ("tessera_tune_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path() const { return (dir_ / "tune.cache").string(); }

  fs::path dir_;
};

TEST_F(TuneCacheTest, RoundTripAcrossReload) {
  const std::string nested = (dir_ / "a" / "b" / "tune.cache").string();  // directories created
  {
    TuneCache cache(nested, h200());
    EXPECT_FALSE(cache.find("matmul", kKey).has_value());
    EXPECT_TRUE(cache.warnings().empty());  // a missing file is no warning
    cache.put("matmul", kKey, {"bn=256,stages=4,cluster=2", 123.456789012345678});
    cache.put("matmul", "key with spaces", {"", 0.1});
    cache.put("softmax", kKey, {"cluster", 7});
    cache.put("softmax", kKey, {"warp", 5.5});  // replaces
    EXPECT_EQ(config(cache, "matmul", kKey), "bn=256,stages=4,cluster=2");
    EXPECT_TRUE(cache.warnings().empty());
  }
  EXPECT_EQ(slurp(nested).substr(0, 15), "tessera-tune 1\n");
  TuneCache again(nested, h200());
  EXPECT_EQ(config(again, "matmul", kKey), "bn=256,stages=4,cluster=2");
  EXPECT_EQ(time_us(again, "matmul", kKey), 123.456789012345678);  // exactly: shortest round trip
  EXPECT_EQ(config(again, "matmul", "key with spaces"), "");
  EXPECT_EQ(time_us(again, "matmul", "key with spaces"), 0.1);
  EXPECT_EQ(config(again, "softmax", kKey), "warp");
  EXPECT_EQ(time_us(again, "softmax", kKey), 5.5);
  EXPECT_FALSE(again.find("softmax", "other").has_value());
  EXPECT_FALSE(again.find("gelu", kKey).has_value());
  EXPECT_EQ(again.list().size(), 3u);
  EXPECT_TRUE(again.warnings().empty());
}

TEST_F(TuneCacheTest, EmptyPathStaysInMemory) {
  TuneCache memory("", h200());
  memory.put("matmul", kKey, {"a", 1});
  EXPECT_EQ(config(memory, "matmul", kKey), "a");
  EXPECT_TRUE(memory.warnings().empty());
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 0);
}

struct Corruption {
  const char* name;
  std::string text;
  std::string why;  // in the warning
};

void PrintTo(const Corruption& c, std::ostream* os) { *os << c.name; }

class CorruptCache : public TuneCacheTest, public ::testing::WithParamInterface<Corruption> {};

const std::string kHead = "tessera-tune 1\n";
const std::string kNoHeader = "it does not start with 'tessera-tune 1'";
const std::string kGood =
    "NVIDIA H200\t132\t12080\t12080\t0.1.0\tmatmul\t" + kKey + "\tbn=128\t10\n";

INSTANTIATE_TEST_SUITE_P(
    Kinds, CorruptCache,
    ::testing::Values(
        Corruption{"garbage", std::string("\177ELF\0\1\377\376 garbage\n", 17), kNoHeader},
        Corruption{"empty", "", kNoHeader}, Corruption{"no_header", kGood, kNoHeader},
        Corruption{"stale_format", "tessera-tune 0\n" + kGood, "format 'tessera-tune 0'"},
        Corruption{"truncated_line", kHead + kGood + "NVIDIA H200\t132\t120", "cut short"},
        Corruption{"cut_in_time", kHead + kGood.substr(0, kGood.size() - 2), "cut short"},
        Corruption{"missing_field", kHead + kGood + "NVIDIA H200\t132\t12080\n",
                   "line 3: 3 fields"},
        Corruption{"extra_field", kHead + kGood.substr(0, kGood.size() - 1) + "\tx\n",
                   "line 2: 10"},
        Corruption{"bad_time", kHead + kGood.substr(0, kGood.size() - 3) + "1x\n",
                   "line 2: the time"},
        Corruption{"nan_time", kHead + kGood.substr(0, kGood.size() - 3) + "nan\n",
                   "line 2: the time"},
        Corruption{"bad_sm_count", kHead + "NVIDIA H200\t13z\t12080\t12080\t0.1.0\tm\tk\tc\t1\n",
                   "line 2: a version or SM count"}),
    [](const auto& p) { return std::string(p.param.name); });

TEST_P(CorruptCache, IgnoredWithOneWarningThenRepaired) {
  write_file(path(), GetParam().text);
  ::testing::internal::CaptureStderr();
  TuneCache cache(path(), h200());
  EXPECT_FALSE(cache.find("matmul", kKey).has_value());  // not even the good line is trusted
  EXPECT_TRUE(cache.list().empty());
  cache.put("softmax", "rows=4096", {"cluster=4", 3.25});
  cache.put("softmax", "rows=8192", {"cluster=8", 6.5});
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(cache.warnings().size(), 1u);
  for (const std::string& part : {path(), GetParam().why})
    EXPECT_NE(cache.warnings()[0].find(part), std::string::npos) << cache.warnings()[0];
  EXPECT_EQ(lines_starting(err, "tessera: "), 1u) << err;
  EXPECT_EQ(config(cache, "softmax", "rows=4096"), "cluster=4");

  EXPECT_EQ(slurp(path()).substr(0, 15), "tessera-tune 1\n");
  TuneCache repaired(path(), h200());
  EXPECT_TRUE(repaired.warnings().empty());
  EXPECT_EQ(repaired.list().size(), 2u);
  EXPECT_EQ(time_us(repaired, "softmax", "rows=8192"), 6.5);
}

TEST_F(TuneCacheTest, ForeignGpuNotReturnedButKeptOnRewrite) {
  TuneIdentity h100 = h200(), h200_nvl = h200();
  h100.gpu_name = "NVIDIA H100 80GB HBM3";
  h200_nvl.sm_count = 114;
  TuneCache(path(), h100).put("matmul", kKey, {"h100", 1});
  TuneCache(path(), h200_nvl).put("matmul", kKey, {"fewer sms", 2});

  TuneCache mine(path(), h200());
  EXPECT_FALSE(mine.find("matmul", kKey).has_value());
  EXPECT_EQ(mine.list().size(), 2u);
  mine.put("matmul", kKey, {"mine", 3});
  mine.put("matmul", "other", {"mine too", 4});
  EXPECT_EQ(config(mine, "matmul", kKey), "mine");
  EXPECT_EQ(mine.list().size(), 4u);

  EXPECT_EQ(config(TuneCache(path(), h100), "matmul", kKey), "h100");
  EXPECT_EQ(config(TuneCache(path(), h200_nvl), "matmul", kKey), "fewer sms");
  EXPECT_EQ(config(TuneCache(path(), h100), "matmul", "other"), "<none>");
  EXPECT_EQ(time_us(TuneCache(path(), h200()), "matmul", kKey), 3);
}

TEST_F(TuneCacheTest, VersionBumpDoesNotMatch) {
  TuneCache(path(), h200()).put("matmul", kKey, {"old", 1});
  TuneIdentity tessera = h200(), driver = h200(), runtime = h200();
  tessera.tessera_version = "0.2.0";
  driver.driver_version = 12090;
  runtime.runtime_version = 12090;
  for (const auto& id : {tessera, driver, runtime}) {
    TuneCache cache(path(), id);
    EXPECT_FALSE(cache.find("matmul", kKey).has_value())
        << id.tessera_version << " " << id.driver_version;
    EXPECT_EQ(cache.list().size(), 1u);
  }
  EXPECT_EQ(config(TuneCache(path(), h200()), "matmul", kKey), "old");
}

TEST_F(TuneCacheTest, UnreadableFileWarnsOnceAndIsReplaced) {
  fs::create_directories(path());  // a directory where the file should be: reading it fails
  TuneCache cache(path(), h200());
  ASSERT_EQ(cache.warnings().size(), 1u);
  // rename() cannot replace a directory either: the result stays in memory, with one more warning.
  cache.put("matmul", kKey, {"a", 1});
  cache.put("matmul", "other", {"b", 2});
  EXPECT_EQ(config(cache, "matmul", kKey), "a");
  EXPECT_EQ(cache.warnings().size(), 2u);
  const auto files = std::distance(fs::directory_iterator(dir_), fs::directory_iterator());
  EXPECT_EQ(files, 2);  // the cache (a directory) and its lock: no temporary file left
  fs::remove(path());
  cache.put("matmul", "third", {"c", 3});  // writes what was kept too
  EXPECT_EQ(cache.warnings().size(), 2u);
  TuneCache again(path(), h200());
  EXPECT_TRUE(again.warnings().empty());
  EXPECT_EQ(again.list().size(), 3u);
}

TEST_F(TuneCacheTest, UnwritableDirectoryKeepsResultsInMemory) {
  write_file(dir_ / "file", "x");  // the cache directory would be under a regular file
  const std::string under_file = (dir_ / "file" / "tessera" / "tune.cache").string();
  TuneCache cache(under_file, h200());
  EXPECT_TRUE(cache.warnings().empty());
  ::testing::internal::CaptureStderr();
  EXPECT_NO_THROW(cache.put("matmul", kKey, {"a", 1}));
  EXPECT_NO_THROW(cache.put("matmul", "other", {"b", 2}));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(config(cache, "matmul", kKey), "a");
  EXPECT_EQ(config(cache, "matmul", "other"), "b");
  ASSERT_EQ(cache.warnings().size(), 1u);
  EXPECT_NE(cache.warnings()[0].find("cannot write"), std::string::npos) << cache.warnings()[0];
  EXPECT_EQ(lines_starting(err, "tessera: "), 1u) << err;
}

// Runs fn, expects a tessera::Error of kind value that names argument `arg`.
template <class F>
void expect_value_error(F fn, const std::string& arg) {
  try {
    fn();
    ADD_FAILURE() << "expected tessera::Error for " << arg;
  } catch (const tessera::Error& e) {
    EXPECT_EQ(e.kind(), tessera::ErrorKind::value) << e.what();
    EXPECT_NE(std::string(e.what()).find("argument '" + arg + "'"), std::string::npos) << e.what();
  }
}

TEST_F(TuneCacheTest, BadArgumentsNameTheArgument) {
  TuneCache cache(path(), h200());
  expect_value_error([&] { cache.put("matmul", "a\tb", {"c", 1}); }, "key");
  expect_value_error([&] { cache.put("matmul", "a\nb", {"c", 1}); }, "key");
  expect_value_error([&] { cache.put("matmul", "", {"c", 1}); }, "key");
  expect_value_error([&] { cache.put("mat\tmul", "k", {"c", 1}); }, "op");
  expect_value_error([&] { cache.put("", "k", {"c", 1}); }, "op");
  expect_value_error([&] { cache.put("matmul", "k", {"bn=1\r", 1}); }, "config");
  expect_value_error([&] { cache.put("matmul", "k", {"c", -1}); }, "time_us");
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  expect_value_error([&] { cache.put("matmul", "k", {"c", nan}); }, "time_us");
  expect_value_error([&] { cache.put("matmul", "k", {"c", inf}); }, "time_us");
  TuneIdentity tab = h200();
  tab.gpu_name = "NVIDIA\tH200";
  expect_value_error([&] { TuneCache(path(), tab); }, "id.gpu_name");
  TuneIdentity empty = h200();
  empty.tessera_version = "";
  expect_value_error([&] { TuneCache(path(), empty); }, "id.tessera_version");
  EXPECT_TRUE(cache.list().empty());
  EXPECT_FALSE(fs::exists(path()));
  EXPECT_FALSE(cache.find("matmul", "a\tb").has_value());
}

// A child process: no gtest assertions here, the exit status says what went wrong.
constexpr int kPerChild = 50;
std::string child_key(int child, int i) {
  return "child" + std::to_string(child) + "|m" + std::to_string(i);
}

[[noreturn]] void put_from_child(const std::string& path, int child, int start_fd) {
  char c;  // the parent closes the pipe to start every child at once
  while (::read(start_fd, &c, 1) < 0 && errno == EINTR) continue;
  int status = 0;
  try {
    TuneCache cache(path, h200());
    for (int i = 0; i < kPerChild; ++i)
      cache.put("matmul", child_key(child, i), {"c" + std::to_string(child), i + 0.5});
    if (!cache.warnings().empty()) status = 2;
  } catch (...) {
    status = 3;
  }
  ::_exit(status);
}

class ConcurrentWriters : public TuneCacheTest, public ::testing::WithParamInterface<int> {};
INSTANTIATE_TEST_SUITE_P(Processes, ConcurrentWriters, ::testing::Values(2, 3, 4),
                         [](const auto& p) { return std::to_string(p.param); });

TEST_P(ConcurrentWriters, LoseNothing) {
  const int n = GetParam();
  int start[2];
  ASSERT_EQ(::pipe(start), 0);
  std::vector<pid_t> children;
  for (int child = 0; child < n; ++child) {
    const pid_t pid = ::fork();
    if (pid < 0) break;  // closing the pipe below still lets the others finish
    if (pid == 0) {
      ::close(start[1]);
      put_from_child(path(), child, start[0]);
    }
    children.push_back(pid);
  }
  ::close(start[0]);
  ::close(start[1]);
  for (const pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  }
  ASSERT_EQ(children.size(), static_cast<std::size_t>(n)) << "fork failed";
  TuneCache cache(path(), h200());
  EXPECT_TRUE(cache.warnings().empty());
  EXPECT_EQ(cache.list().size(), static_cast<std::size_t>(n * kPerChild));
  for (int child = 0; child < n; ++child)
    for (int i = 0; i < kPerChild; ++i) {
      EXPECT_EQ(config(cache, "matmul", child_key(child, i)), "c" + std::to_string(child));
      EXPECT_EQ(time_us(cache, "matmul", child_key(child, i)), i + 0.5);
    }
  for (const auto& f : fs::directory_iterator(dir_))  // no temporary file left behind
    EXPECT_TRUE(f.path().filename() == "tune.cache" || f.path().filename() == "tune.cache.lock")
        << f.path();
}

// Sets or unsets an environment variable for its lifetime.
class EnvVar {
 public:
  EnvVar(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    value ? ::setenv(name, value, 1) : ::unsetenv(name);
  }
  ~EnvVar() { old_ ? ::setenv(name_, old_->c_str(), 1) : ::unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(TuneCachePath, DefaultHonoursTheEnvironment) {
  using tessera::runtime::default_cache_path;
  EnvVar home("HOME", "/home/u"), xdg("XDG_CACHE_HOME", nullptr), dir("TESSERA_CACHE_DIR", nullptr);
  EXPECT_EQ(default_cache_path(), "/home/u/.cache/tessera/tune.cache");
  {
    EnvVar x("XDG_CACHE_HOME", "/xdg");
    EXPECT_EQ(default_cache_path(), "/xdg/tessera/tune.cache");
    EnvVar t("TESSERA_CACHE_DIR", "/scratch/tune/");
    EXPECT_EQ(default_cache_path(), "/scratch/tune/tune.cache");
    EnvVar empty("TESSERA_CACHE_DIR", "");
    EXPECT_EQ(default_cache_path(), "/xdg/tessera/tune.cache");
  }
  {
    EnvVar relative("XDG_CACHE_HOME", "cache");  // the XDG spec says to ignore it
    EXPECT_EQ(default_cache_path(), "/home/u/.cache/tessera/tune.cache");
  }
  EnvVar no_home("HOME", nullptr);
  EXPECT_EQ(default_cache_path(), "");
}

TEST(TuneCacheIdentity, CurrentIdentity) {
  if (tessera::runtime::device_count() == 0) {
    EXPECT_THROW(tessera::runtime::current_tune_identity(0), tessera::Error);  // not a crash
    return;
  }
  const TuneIdentity id = tessera::runtime::current_tune_identity(0);
  EXPECT_FALSE(id.gpu_name.empty());
  EXPECT_GT(id.sm_count, 0);
  EXPECT_GT(id.driver_version, 0);
  EXPECT_GT(id.runtime_version, 0);
  EXPECT_EQ(id.tessera_version, tessera::kVersion);
}

}  // namespace
