// Progress: one line rewritten in place on a terminal, one line per step in a log or a pipe
// (where '\r' would leave a mess).
#include <sys/ioctl.h>
#include <unistd.h>

#include <iostream>
#include <string>

#include "bench/bench.hpp"

namespace tessera::bench {
namespace {

// The stream's file descriptor if it is one of the standard streams; an ostringstream or a file
// stream has none and is never treated as a terminal.
int standard_fd(const std::ostream& os) {
  if (&os == &std::cout) return STDOUT_FILENO;
  if (&os == &std::cerr || &os == &std::clog) return STDERR_FILENO;
  return -1;
}

// Columns of the terminal, 0 when unknown.
int terminal_columns(int fd) {
  winsize ws{};
  if (ioctl(fd, TIOCGWINSZ, &ws) == 0) return ws.ws_col;
  return 0;
}

}  // namespace

Progress::Progress(int total, std::ostream& os) : total_(total), os_(os), tty_(false) {
  const int fd = standard_fd(os);
  if (fd >= 0 && isatty(fd)) {
    tty_ = true;
    fd_ = fd;
  }
}

void Progress::step(const std::string& label) {
  ++count_;
  std::string line = "[";
  line.append(std::to_string(count_));
  if (total_ > 0) line.append("/").append(std::to_string(total_));  // 0: total not known
  line.append("] ").append(label);
  if (!tty_) {
    os_ << line << '\n' << std::flush;
    return;
  }
  // A line wider than the terminal wraps, and '\r' then returns only to the start of its last
  // part: cut it to fit.
  const int cols = terminal_columns(fd_);
  if (cols > 1 && line.size() >= static_cast<std::size_t>(cols)) line.resize(cols - 1);
  // "\033[K" clears what a longer previous label left to the right.
  os_ << '\r' << line << "\033[K" << std::flush;
  line_open_ = true;
}

void Progress::done() {
  if (tty_ && line_open_) os_ << '\n' << std::flush;
  line_open_ = false;
}

}  // namespace tessera::bench
