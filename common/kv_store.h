// KeyValueStore: the rendezvous store. The controller serves one over gRPC
// (Registry.Set/Get/Add/Wait); tests use one in-process. Thread-safe: every
// method may be called from any thread; waiters block on a condition variable
// and always return by their deadline.
#ifndef BATON_COMMON_KV_STORE_H_
#define BATON_COMMON_KV_STORE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace baton {

// What a communicator needs from a rendezvous service. Implemented by
// KeyValueStore (in-process) and by the worker's gRPC client of the
// controller's Registry.
class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Waits up to `timeout` for the key; DEADLINE_EXCEEDED naming it otherwise.
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;
  // Adds `delta` to the integer stored at key (missing = 0); returns the sum.
  virtual absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) = 0;
  virtual absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) = 0;
  // Whether all keys exist (no waiting), and how many keys the store holds.
  virtual absl::StatusOr<bool> Check(const std::vector<std::string>& keys,
                                     int64_t* num_keys) = 0;
  // Deletes `key`, or with prefix=true every key that starts with it.
  virtual absl::StatusOr<int64_t> Delete(const std::string& key, bool prefix) = 0;
};

class KeyValueStore : public Rendezvous {
 public:
  // Bounds that keep one client from exhausting the controller's memory.
  static constexpr size_t kMaxKeyBytes = 4096;
  static constexpr size_t kMaxValueBytes = 1 << 20;
  static constexpr size_t kMaxKeys = 1 << 20;
  // All keys and values together: 1,000 clients storing 1 MiB each cannot
  // take the controller's memory.
  static constexpr size_t kMaxTotalBytes = size_t{64} << 20;
  // Aborted prefixes remembered (the oldest are forgotten first).
  static constexpr size_t kMaxAbortedPrefixes = 4096;

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys, int64_t* num_keys) override;
  absl::StatusOr<int64_t> Delete(const std::string& key, bool prefix) override;

  // Ends every current and future wait on keys under `prefix` with ABORTED
  // and `reason` (a rendezvous of an abandoned mesh returns at once instead
  // of running into its timeout), deletes its keys, and refuses new ones.
  void AbortPrefix(const std::string& prefix, const std::string& reason);
  // Bytes of keys and values held.
  size_t bytes() const;

 private:
  // The abort reason for `key`, or nullptr.
  const std::string* AbortedReason(const std::string& key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ValidateKey(const std::string& key) const;
  bool HasAll(const std::vector<std::string>& keys) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, std::string> data_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> aborted_prefixes_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> aborted_order_ ABSL_GUARDED_BY(mu_);  // oldest first
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Removes `it`, keeping bytes_ right.
  // Stores `value` under `key` (`it`: its entry, or end()) within the key
  // and byte limits.
  absl::Status PutLocked(std::map<std::string, std::string>::iterator it, const std::string& key,
                         const std::string& value) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::map<std::string, std::string>::iterator Erase(std::map<std::string, std::string>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

}  // namespace baton

#endif  // BATON_COMMON_KV_STORE_H_
