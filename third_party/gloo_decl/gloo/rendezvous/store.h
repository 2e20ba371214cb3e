// See third_party/gloo_decl/README.md: the base of c10d's inline GlooStore,
// with the functions it overrides (GLOO_STORE_HAS_STORE_V2 stays undefined).
// Baton never makes a GlooStore: LibTorch makes its own, with gloo's real
// declaration.
#pragma once
#include <chrono>
#include <string>
#include <vector>
namespace gloo {
namespace rendezvous {
class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& data) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) = 0;
};
}  // namespace rendezvous
}  // namespace gloo
