// libFuzzer: the rendezvous store's request handling — the Registry's KV
// requests (Set, Get, Add, Wait, Check, Delete) and mesh aborts, decoded from
// the input and applied in order to one store. Waits never block (timeout 0).
#include <cstddef>
#include <cstdint>

#include "google/protobuf/stubs/logging.h"

#include "common/kv_store.h"
#include "proto/registry.pb.h"

// Protobuf's complaints about malformed inputs are expected by the thousand.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  baton::KeyValueStore kv;
  size_t at = 0;
  while (at + 3 <= size) {
    const uint8_t op = data[at];
    const size_t len = static_cast<size_t>(data[at + 1]) | static_cast<size_t>(data[at + 2]) << 8;
    at += 3;
    if (at + len > size) break;
    const void* body = data + at;
    const int n = static_cast<int>(len);
    at += len;
    switch (op % 7) {
      case 0: {
        baton::v1::KvSetRequest r;
        if (r.ParseFromArray(body, n)) (void)kv.Set(r.key(), r.value());
        break;
      }
      case 1: {
        baton::v1::KvGetRequest r;
        if (r.ParseFromArray(body, n)) (void)kv.Get(r.key(), absl::ZeroDuration());
        break;
      }
      case 2: {
        baton::v1::KvAddRequest r;
        if (r.ParseFromArray(body, n)) (void)kv.Add(r.key(), r.delta());
        break;
      }
      case 3: {
        baton::v1::KvWaitRequest r;
        if (r.ParseFromArray(body, n)) (void)kv.Wait({r.keys().begin(), r.keys().end()}, absl::ZeroDuration());
        break;
      }
      case 4: {
        baton::v1::KvCheckRequest r;
        int64_t keys = 0;
        if (r.ParseFromArray(body, n)) (void)kv.Check({r.keys().begin(), r.keys().end()}, &keys);
        break;
      }
      case 5: {
        baton::v1::KvDeleteRequest r;
        if (r.ParseFromArray(body, n)) (void)kv.Delete(r.key(), r.prefix());
        break;
      }
      default: {
        baton::v1::KvDeleteRequest r;  // a mesh released: its prefix aborted
        if (r.ParseFromArray(body, n)) kv.AbortPrefix(r.key(), "fuzz");
        break;
      }
    }
  }
  return 0;
}
