#include "runtime/tune_cache.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string_view>
#include <system_error>
#include <utility>

#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "tessera/version.hpp"

// The file: a first line "tessera-tune <format>", then one line per record of nine fields
// separated by tabs: gpu_name, sm_count, driver_version, runtime_version, tessera_version, op,
// key, config, time_us. No field may hold a tab or a line break (put() and the constructor refuse
// them), so the fields need no escaping. Every line ends in '\n': a last line without one was cut.

namespace tessera::runtime {
namespace {

constexpr std::string_view kMagic = "tessera-tune";
constexpr int kFormat = 1;  // bump when the line layout changes: older files are then ignored
constexpr int kFields = 9;

std::string header() { return std::string(kMagic) + " " + std::to_string(kFormat); }

bool breaks_line(std::string_view s) { return s.find_first_of("\t\n\r") != std::string_view::npos; }

// `s` in double quotes with its control characters escaped, for messages.
std::string escaped(std::string_view s) {
  std::string q = "\"";
  for (char c : s)
    q += c == '\t' ? "\\t" : c == '\n' ? "\\n" : c == '\r' ? "\\r" : std::string(1, c);
  return q + "\"";
}

void check_field(const char* op, const char* arg, const std::string& value, bool may_be_empty) {
  if (!may_be_empty && value.empty())
    detail::throw_arg(ErrorKind::value, op, arg, "a non-empty string", "\"\"");
  if (breaks_line(value))
    detail::throw_arg(ErrorKind::value, op, arg, "no tab or line break", escaped(value));
}

// A record's first seven fields: its line up to the config, and its key in the map (unique, since
// no field holds a tab).
std::string prefix(const TuneIdentity& id, const std::string& op, const std::string& key) {
  return id.gpu_name + '\t' + std::to_string(id.sm_count) + '\t' +
         std::to_string(id.driver_version) + '\t' + std::to_string(id.runtime_version) + '\t' +
         id.tessera_version + '\t' + op + '\t' + key;
}

// from_chars rather than strtod: a C locale with a decimal comma must not change the file.
template <class T>
bool parse_number(std::string_view s, T& value) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  return !s.empty() && ec == std::errc() && end == s.data() + s.size();
}

// Parses a whole file into `out`; returns what is wrong with it, or "".
std::string parse(const std::string& text, std::map<std::string, TuneRecord>& out) {
  const std::size_t first_end = text.find('\n');
  const std::string first = text.substr(0, first_end);
  if (first != header()) {
    // Another format of ours is named; a long first line is more likely garbage, not echoed.
    if (first.compare(0, kMagic.size() + 1, std::string(kMagic) + " ") == 0 && first.size() < 40)
      return "it is in format '" + first + "', this build reads '" + header() + "'";
    return "it does not start with '" + header() + "'";
  }
  int line_no = 1;
  for (std::size_t at = first_end + 1; at < text.size(); ++line_no) {
    const std::size_t end = text.find('\n', at);
    if (end == std::string::npos) return "its last line is cut short";
    const std::string_view line(text.data() + at, end - at);
    at = end + 1;
    std::vector<std::string_view> f;
    for (std::size_t b = 0;;) {
      const std::size_t tab = line.find('\t', b);
      f.push_back(line.substr(b, tab == std::string_view::npos ? std::string_view::npos : tab - b));
      if (tab == std::string_view::npos) break;
      b = tab + 1;
    }
    const std::string where = "line " + std::to_string(line_no + 1) + ": ";
    if (f.size() != kFields)
      return where + std::to_string(f.size()) + " fields, expected " + std::to_string(kFields);
    TuneRecord r;
    r.id.gpu_name = f[0];
    r.id.tessera_version = f[4];
    r.op = f[5];
    r.key = f[6];
    r.entry.config = f[7];
    if (!parse_number(f[1], r.id.sm_count) || !parse_number(f[2], r.id.driver_version) ||
        !parse_number(f[3], r.id.runtime_version))
      return where + "a version or SM count is not an integer";
    if (!parse_number(f[8], r.entry.time_us) || !std::isfinite(r.entry.time_us) ||
        r.entry.time_us < 0)
      return where + "the time is not a number >= 0";
    if (r.id.gpu_name.empty() || r.id.tessera_version.empty() || r.op.empty() || r.key.empty())
      return where + "an empty GPU name, version, op or key";
    out[prefix(r.id, r.op, r.key)] = std::move(r);
  }
  return "";
}

std::string format(const std::map<std::string, TuneRecord>& records) {
  std::string text = header() + "\n";
  for (const auto& [k, r] : records) {
    char time[64];
    // Shortest text that reads back as the same double.
    const auto res = std::to_chars(time, time + sizeof time, r.entry.time_us);
    text += k + '\t' + r.entry.config + '\t' + std::string(time, res.ptr) + '\n';
  }
  return text;
}

// "cannot lock /x/tune.cache.lock: No space left on device", from errno.
std::string sys_error(const std::string& what) {
  return what + ": " + std::generic_category().message(errno);
}

enum class ReadResult { ok, missing, failed };

ReadResult read_all(const std::string& path, std::string& text, std::string& error) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return ReadResult::missing;
    error = sys_error("cannot open it");
    return ReadResult::failed;
  }
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n > 0)
      text.append(buf, static_cast<std::size_t>(n));
    else if (errno != EINTR) {
      error = sys_error("cannot read it");
      ::close(fd);
      return ReadResult::failed;
    }
  }
  ::close(fd);
  return ReadResult::ok;
}

// Writes `text` to a fresh file next to `path`, flushed to disk, and renames it over `path`: a
// reader sees the old file or the new one, never part of one. Returns what failed, or "".
std::string replace_file(const std::string& path, const std::string& text) {
  // The pid keeps apart processes of this machine, the random part those of others sharing it.
  const std::string tmp =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(std::random_device{}());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return sys_error("cannot create " + tmp);
  std::string err;
  for (std::size_t done = 0; done < text.size() && err.empty();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n >= 0)
      done += static_cast<std::size_t>(n);
    else if (errno != EINTR)
      err = sys_error("cannot write " + tmp);
  }
  if (err.empty() && ::fsync(fd) != 0) err = sys_error("cannot flush " + tmp);
  if (::close(fd) != 0 && err.empty()) err = sys_error("cannot close " + tmp);
  if (err.empty() && ::rename(tmp.c_str(), path.c_str()) != 0)
    err = sys_error("cannot rename " + tmp + " over it");
  if (!err.empty()) ::unlink(tmp.c_str());
  return err;
}

// An exclusive flock() on `path` for the object's lifetime (closing the file releases it). The
// lock file is never removed: a process could otherwise lock a file that another has just
// unlinked, and both would write at once.
class FileLock {
 public:
  explicit FileLock(const std::string& path)
      : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
    if (fd_ < 0)
      error_ = sys_error("cannot open " + path);
    else
      while (::flock(fd_, LOCK_EX) != 0)
        if (errno != EINTR) {
          error_ = sys_error("cannot lock " + path);
          break;
        }
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  const std::string& error() const { return error_; }

 private:
  int fd_;
  std::string error_;
};

}  // namespace

bool operator==(const TuneIdentity& a, const TuneIdentity& b) {
  return a.gpu_name == b.gpu_name && a.sm_count == b.sm_count &&
         a.driver_version == b.driver_version && a.runtime_version == b.runtime_version &&
         a.tessera_version == b.tessera_version;
}

TuneIdentity current_tune_identity(int device) {
  const cudaDeviceProp& props = device_props(device);
  TuneIdentity id;
  id.gpu_name = props.name;
  for (char& c : id.gpu_name)  // a name the file could not hold would make the constructor throw
    if (breaks_line(std::string_view(&c, 1))) c = ' ';
  id.sm_count = props.multiProcessorCount;
  TESSERA_CUDA_CHECK(cudaDriverGetVersion(&id.driver_version));
  TESSERA_CUDA_CHECK(cudaRuntimeGetVersion(&id.runtime_version));
  id.tessera_version = kVersion;
  return id;
}

std::string default_cache_path() {
  namespace fs = std::filesystem;
  const auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v ? v : "");
  };
  if (const auto dir = env("TESSERA_CACHE_DIR"); !dir.empty())
    return (fs::path(dir) / "tune.cache").string();
  if (const auto dir = env("XDG_CACHE_HOME"); !dir.empty() && dir.front() == '/')
    return (fs::path(dir) / "tessera" / "tune.cache").string();
  if (const auto dir = env("HOME"); !dir.empty())
    return (fs::path(dir) / ".cache" / "tessera" / "tune.cache").string();
  return "";
}

TuneCache::TuneCache(std::string path, TuneIdentity id)
    : path_(std::move(path)), id_(std::move(id)) {
  check_field("TuneCache", "id.gpu_name", id_.gpu_name, false);
  check_field("TuneCache", "id.tessera_version", id_.tessera_version, false);
  if (!path_.empty()) load(records_);
}

std::optional<TuneEntry> TuneCache::find(const std::string& op, const std::string& key) const {
  // Never stored; and a tab would let ("a", "b\tc") find ("a\tb", "c").
  if (breaks_line(op) || breaks_line(key)) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = records_.find(prefix(id_, op, key));
  if (it == records_.end()) return std::nullopt;
  return it->second.entry;
}

void TuneCache::put(const std::string& op, const std::string& key, TuneEntry entry) {
  check_field("TuneCache.put", "op", op, false);
  check_field("TuneCache.put", "key", key, false);
  check_field("TuneCache.put", "config", entry.config, true);
  if (!std::isfinite(entry.time_us) || entry.time_us < 0)
    detail::throw_arg(ErrorKind::value, "TuneCache.put", "time_us", "a finite number >= 0",
                      std::to_string(entry.time_us));

  std::lock_guard<std::mutex> lock(mu_);
  const std::string k = prefix(id_, op, key);
  records_[k] = unsaved_[k] = TuneRecord{id_, op, key, std::move(entry)};
  if (path_.empty()) return;

  const auto cannot_write = [&](const std::string& why) {
    warn_once(warned_write_, "cannot write the tuning cache " + path_ + ": " + why +
                                 "; tuning results are kept in memory for this process only");
  };
  std::error_code ec;
  const auto dir = std::filesystem::path(path_).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  if (ec) return cannot_write("cannot create " + dir.string() + ": " + ec.message());
  const FileLock file_lock(path_ + ".lock");
  if (!file_lock.error().empty()) return cannot_write(file_lock.error());
  // Under the lock, the file holds every other writer's results: merge ours into it. A file that
  // cannot be used is replaced by what this process knows.
  Records merged;
  if (!load(merged)) merged = records_;
  for (const auto& [uk, r] : unsaved_) merged[uk] = r;
  if (const std::string err = replace_file(path_, format(merged)); !err.empty())
    return cannot_write(err);
  records_ = std::move(merged);
  unsaved_.clear();
}

std::vector<TuneRecord> TuneCache::list() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<TuneRecord> out;
  for (const auto& [k, r] : records_) out.push_back(r);
  return out;
}

std::vector<std::string> TuneCache::warnings() const {
  std::lock_guard<std::mutex> lock(mu_);
  return warnings_;
}

void TuneCache::warn_once(bool& warned, const std::string& message) {
  if (warned) return;
  warned = true;
  warnings_.push_back(message);
  std::fprintf(stderr, "tessera: %s\n", message.c_str());
}

bool TuneCache::load(Records& out) {
  std::string text, error;
  const ReadResult got = read_all(path_, text, error);
  if (got == ReadResult::missing) {
    out.clear();
    return true;
  }
  Records parsed;
  if (got == ReadResult::ok) error = parse(text, parsed);
  if (!error.empty()) {
    warn_once(warned_read_, "ignoring the tuning cache " + path_ + ": " + error +
                                "; the next tuning result rewrites it");
    return false;
  }
  out = std::move(parsed);
  return true;
}

}  // namespace tessera::runtime
