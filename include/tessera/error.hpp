// The one exception type tessera throws. Python maps kind() to ValueError/TypeError/RuntimeError.
#pragma once

#include <stdexcept>
#include <string>

namespace tessera {

enum class ErrorKind { value, type, runtime };

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

}  // namespace tessera
