#include "bench/format.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "tessera/error.hpp"

namespace tessera::bench::format {

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string number(double v) {
  char buf[64];
  if (std::isfinite(v) && v == std::trunc(v) && std::fabs(v) < 9007199254740992.0)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else
    std::snprintf(buf, sizeof buf, "%.12g", v);
  return buf;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {  // other control characters have no short form
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);  // UTF-8 passes through unchanged
        }
    }
  }
  return out + "\"";
}

std::string xml_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';  // a quote inside a quoted field is doubled
    out += c;
  }
  return out + "\"";
}

Derived derive(const Row& row, const Peaks* peaks) {
  Derived d;
  if (!(row.stats.median_ms > 0)) return d;
  if (row.bytes > 0) {
    d.gbps = gbps(row);
    if (peaks && peaks->copy_gbps > 0) d.pct_copy = 100.0 * *d.gbps / peaks->copy_gbps;
  }
  if (row.flops > 0) {
    d.tflops = tflops(row);
    if (peaks && peaks->bf16_tflops > 0) d.pct_gemm = 100.0 * *d.tflops / peaks->bf16_tflops;
  }
  return d;
}

// Writes the whole text or throws, naming the path and the system's reason.
void write_file(const std::string& path, const std::string& text, const char* what) {
  errno = 0;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  bool ok = f != nullptr;
  if (f) {
    ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    ok = (std::fclose(f) == 0) && ok;
  }
  if (!ok) {
    std::string msg = std::string("tessera.bench.") + what + ": cannot write '" + path + "'";
    if (errno) msg += std::string(": ") + std::strerror(errno);
    throw Error(ErrorKind::runtime, msg);
  }
}

}  // namespace tessera::bench::format
