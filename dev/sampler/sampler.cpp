// A small CPU sampling profiler for the host cost of calls (the device has no perf): SIGPROF every
// millisecond of process CPU time, a backtrace per sample, symbolized with dladdr at stop. Loaded
// with ctypes: start(), the work, stop(path, top) writes the functions by inclusive and by self
// samples. Not async-signal-safe in theory (backtrace), good enough for a lab.
//   g++ -O2 -shared -fPIC dev/sampler/sampler.cpp -o dev/sampler/libsampler.so -ldl
#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/time.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace {
constexpr int kDepth = 48;
constexpr int kMax = 400000;
struct Sample { int n; void* pc[kDepth]; };
Sample* samples = nullptr;
std::atomic<int> count{0};

void on_prof(int, siginfo_t*, void*) {
  const int i = count.fetch_add(1, std::memory_order_relaxed);
  if (i >= kMax) return;
  samples[i].n = backtrace(samples[i].pc, kDepth);
}

std::string name_of(void* pc) {
  Dl_info info{};
  if (dladdr(pc, &info) && info.dli_sname) {
    int status = 0;
    char* d = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
    std::string s = status == 0 && d ? d : info.dli_sname;
    std::free(d);
    if (s.size() > 160) s = s.substr(0, 160);
    return s;
  }
  char buf[512];
  const char* lib = info.dli_fname ? std::strrchr(info.dli_fname, '/') : nullptr;
  std::snprintf(buf, sizeof buf, "%s+0x%lx", lib ? lib + 1 : "?",
                static_cast<unsigned long>(reinterpret_cast<char*>(pc) - static_cast<char*>(info.dli_fbase)));
  return buf;
}
}  // namespace

extern "C" int sampler_start(int interval_us) {
  if (!samples) samples = static_cast<Sample*>(std::calloc(kMax, sizeof(Sample)));
  void* warm[4];
  backtrace(warm, 4);  // loads the unwinder outside the handler
  count = 0;
  struct sigaction sa {};
  sa.sa_sigaction = on_prof;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigaction(SIGPROF, &sa, nullptr);
  itimerval t{{0, interval_us}, {0, interval_us}};
  return setitimer(ITIMER_PROF, &t, nullptr);
}

// Stops sampling and writes the report; returns the samples taken.
extern "C" int sampler_stop(const char* path, int top) {
  itimerval t{};
  setitimer(ITIMER_PROF, &t, nullptr);
  signal(SIGPROF, SIG_IGN);
  const int n = std::min<int>(count.load(), kMax);
  std::unordered_map<void*, std::string> names;
  std::map<std::string, int> incl, self;
  for (int i = 0; i < n; ++i) {
    std::set<std::string> seen;
    // frames 0-1: this handler and the signal trampoline
    for (int f = 2; f < samples[i].n; ++f) {
      void* pc = samples[i].pc[f];
      auto it = names.find(pc);
      if (it == names.end()) it = names.emplace(pc, name_of(pc)).first;
      if (f == 2) ++self[it->second];
      if (seen.insert(it->second).second) ++incl[it->second];
    }
  }
  FILE* out = std::fopen(path, "w");
  if (!out) return -1;
  auto dump = [&](const char* title, const std::map<std::string, int>& m) {
    std::vector<std::pair<int, std::string>> v;
    for (const auto& [k, c] : m) v.emplace_back(c, k);
    std::sort(v.rbegin(), v.rend());
    std::fprintf(out, "== %s (of %d samples)\n", title, n);
    for (int i = 0; i < static_cast<int>(v.size()) && i < top; ++i)
      std::fprintf(out, "%6.2f%% %6d  %s\n", 100.0 * v[i].first / std::max(n, 1), v[i].first, v[i].second.c_str());
  };
  dump("inclusive", incl);
  dump("self", self);
  std::fclose(out);
  FILE* raw = std::fopen((std::string(path) + ".raw").c_str(), "w");
  if (!raw) return -1;
  for (int i = 0; i < n; ++i) {
    for (int f = 2; f < samples[i].n; ++f) std::fprintf(raw, "%s%s", f > 2 ? "\t" : "", names[samples[i].pc[f]].c_str());
    std::fprintf(raw, "\n");
  }
  std::fclose(raw);
  return n;
}
