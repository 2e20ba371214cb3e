#include "common/kv_store.h"


#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace baton {

absl::Status KeyValueStore::ValidateKey(const std::string& key) const {
  if (key.empty()) return absl::InvalidArgumentError("empty rendezvous key");
  if (key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous key of ", key.size(), " bytes exceeds ", kMaxKeyBytes));
  }
  return absl::OkStatus();
}

bool KeyValueStore::HasAll(const std::vector<std::string>& keys) const {
  for (const auto& k : keys) {
    if (data_.find(k) == data_.end()) return false;
  }
  return true;
}

absl::Status KeyValueStore::Set(const std::string& key, const std::string& value) {
  if (auto s = ValidateKey(key); !s.ok()) return s;
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous value of ", value.size(), " bytes exceeds ", kMaxValueBytes));
  }
  absl::MutexLock lock(&mu_);
  if (const std::string* reason = AbortedReason(key); reason != nullptr) {
    return absl::AbortedError(absl::StrCat("rendezvous key \"", key, "\" belongs to an aborted mesh: ", *reason));
  }
  return PutLocked(data_.find(key), key, value);
}

absl::Status KeyValueStore::PutLocked(std::map<std::string, std::string>::iterator it, const std::string& key,
                                      const std::string& value) {
  const size_t old_bytes = it == data_.end() ? 0 : key.size() + it->second.size();
  if (it == data_.end() && data_.size() >= kMaxKeys) {
    return absl::ResourceExhaustedError(absl::StrCat("rendezvous store holds ", kMaxKeys, " keys (its limit)"));
  }
  if (bytes_ - old_bytes + key.size() + value.size() > kMaxTotalBytes) {
    return absl::ResourceExhaustedError(absl::StrCat("rendezvous store holds ", bytes_, " bytes; another ",
                                                     key.size() + value.size(), " would pass its limit of ",
                                                     kMaxTotalBytes));
  }
  bytes_ = bytes_ - old_bytes + key.size() + value.size();
  if (it == data_.end()) {
    data_.emplace(key, value);
  } else {
    it->second = value;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> KeyValueStore::Get(const std::string& key, absl::Duration timeout) {
  if (auto s = Wait({key}, timeout); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto it = data_.find(key);
  if (it == data_.end()) return absl::NotFoundError(absl::StrCat("key \"", key, "\" was deleted"));
  return it->second;
}

absl::StatusOr<int64_t> KeyValueStore::Add(const std::string& key, int64_t delta) {
  if (auto s = ValidateKey(key); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  int64_t value = 0;
  auto it = data_.find(key);
  if (it != data_.end() && !absl::SimpleAtoi(it->second, &value)) {
    return absl::FailedPreconditionError(
        absl::StrCat("key \"", key, "\" does not hold an integer"));
  }
  if (const std::string* reason = AbortedReason(key); reason != nullptr) {
    return absl::AbortedError(absl::StrCat("rendezvous key \"", key, "\" belongs to an aborted mesh: ", *reason));
  }
  if (__builtin_add_overflow(value, delta, &value)) {
    return absl::OutOfRangeError(absl::StrCat("adding ", delta, " to key \"", key, "\" overflows"));
  }
  if (auto s = PutLocked(it, key, absl::StrCat(value)); !s.ok()) return s;
  return value;
}

absl::Status KeyValueStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  for (const auto& k : keys) {
    if (auto s = ValidateKey(k); !s.ok()) return s;
  }
  absl::MutexLock lock(&mu_);
  const std::string* aborted = nullptr;
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& k : keys) {
      if ((aborted = AbortedReason(k)) != nullptr) return true;
    }
    return HasAll(keys);
  };
  const bool done = mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  if (aborted != nullptr) {
    return absl::AbortedError(absl::StrCat("rendezvous aborted: ", *aborted));
  }
  if (!done) {
    std::vector<std::string> missing;
    for (const auto& k : keys) {
      if (data_.find(k) == data_.end()) missing.push_back(k);
    }
    return absl::DeadlineExceededError(absl::StrCat("rendezvous keys [", absl::StrJoin(missing, ", "),
                                                    "] not set within ",
                                                    absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

const std::string* KeyValueStore::AbortedReason(const std::string& key) const {
  for (const auto& [prefix, reason] : aborted_prefixes_) {
    if (key.rfind(prefix, 0) == 0) return &reason;
  }
  return nullptr;
}

void KeyValueStore::AbortPrefix(const std::string& prefix, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (aborted_prefixes_.emplace(prefix, reason).second) aborted_order_.push_back(prefix);
  while (aborted_order_.size() > kMaxAbortedPrefixes) {
    aborted_prefixes_.erase(aborted_order_.front());
    aborted_order_.erase(aborted_order_.begin());
  }
  // The mesh is released: its keys go too.
  for (auto it = data_.lower_bound(prefix); it != data_.end() && it->first.rfind(prefix, 0) == 0;) it = Erase(it);
}

size_t KeyValueStore::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

std::map<std::string, std::string>::iterator KeyValueStore::Erase(std::map<std::string, std::string>::iterator it) {
  bytes_ -= it->first.size() + it->second.size();
  return data_.erase(it);
}

absl::StatusOr<bool> KeyValueStore::Check(const std::vector<std::string>& keys,
                                          int64_t* num_keys) {
  absl::MutexLock lock(&mu_);
  if (num_keys != nullptr) *num_keys = static_cast<int64_t>(data_.size());
  return HasAll(keys);
}

absl::StatusOr<int64_t> KeyValueStore::Delete(const std::string& key, bool prefix) {
  if (auto s = ValidateKey(key); !s.ok()) return s;  // an empty prefix would wipe the store
  absl::MutexLock lock(&mu_);
  if (!prefix) {
    auto it = data_.find(key);
    if (it == data_.end()) return 0;
    Erase(it);
    return 1;
  }
  int64_t n = 0;
  for (auto it = data_.lower_bound(key); it != data_.end() && it->first.rfind(key, 0) == 0;) {
    it = Erase(it);
    ++n;
  }
  return n;
}

}  // namespace baton
