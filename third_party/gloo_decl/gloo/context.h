// See third_party/gloo_decl/README.md. c10d holds a context only through
// std::shared_ptr; its one inline use is ProcessGroupGloo::setTimeout, which
// calls the exported member declared here (Baton never makes a Context).
#pragma once
#include <chrono>
namespace gloo {
class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};
}  // namespace gloo
