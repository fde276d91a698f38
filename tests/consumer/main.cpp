// Links against the installed libtessera and checks one call end to end: a null pointer must come
// back as a tessera::Error naming the operator and argument (no GPU needed).
#include <tessera/tessera.hpp>

#include <cstdio>
#include <string>

int main() {
  auto a = tessera::TensorView::contiguous(nullptr, tessera::DType::float32, {16});
  try {
    tessera::gelu(a, a, tessera::GeluApproximate::none, nullptr);
  } catch (const tessera::Error& e) {
    const std::string msg = e.what();
    std::printf("consumer: tessera %s: %s\n", tessera::kVersion, msg.c_str());
    return msg.find("tessera.gelu: argument 'input'") != std::string::npos ? 0 : 1;
  }
  std::printf("consumer: expected tessera::Error\n");
  return 1;
}
