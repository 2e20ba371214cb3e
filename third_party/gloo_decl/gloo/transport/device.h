// See third_party/gloo_decl/README.md.
#pragma once
namespace gloo {
namespace transport {
class Device;         // only ever held through std::shared_ptr by c10d
class UnboundBuffer;  // only ever held through std::unique_ptr by c10d
}  // namespace transport
}  // namespace gloo
