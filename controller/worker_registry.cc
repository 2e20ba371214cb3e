#include "controller/worker_registry.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace baton {
namespace {

constexpr size_t kMaxNameLength = 128;

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > kMaxNameLength) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_' || c == '.';
  });
}

bool ValidAddress(const std::string& address) {
  auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= address.size()) return false;
  if (address.size() > 256) return false;
  return std::all_of(address.begin() + colon + 1, address.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

// The ordinal of a StatefulSet-style name ("worker-3" -> 3), or -1.
int Ordinal(const std::string& name) {
  auto dash = name.rfind('-');
  if (dash == std::string::npos || dash + 1 >= name.size() || name.size() - dash > 7) return -1;
  int n = 0;
  for (size_t i = dash + 1; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    n = n * 10 + (name[i] - '0');
  }
  return n;
}

}  // namespace

WorkerRegistry::WorkerRegistry(absl::Duration heartbeat_timeout, EventLog* events, Clock clock)
    : heartbeat_timeout_(heartbeat_timeout), events_(events), clock_(std::move(clock)) {}

absl::StatusOr<int> WorkerRegistry::Register(const baton::v1::WorkerInfo& info) {
  if (!ValidName(info.name())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid worker name \"", info.name().substr(0, kMaxNameLength),
        "\": use 1-128 letters, digits, '-', '_' or '.'"));
  }
  if (!ValidAddress(info.address())) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid worker address \"", info.address().substr(0, 256),
                     "\" for ", info.name(), ": expected HOST:PORT"));
  }
  if (!info.http_address().empty() && !ValidAddress(info.http_address())) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid worker HTTP address \"", info.http_address().substr(0, 256), "\" for ", info.name(),
                     ": expected HOST:PORT"));
  }
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(info.name());
  baton::v1::Event::Kind kind = baton::v1::Event::WORKER_REGISTERED;
  int rank;
  if (it == workers_.end()) {
    if (workers_.size() >= kMaxWorkers) {
      return absl::ResourceExhaustedError(absl::StrCat("the fleet has ", kMaxWorkers, " workers registered (its limit)"));
    }
    // A StatefulSet ordinal asks for its own rank; otherwise, or if taken,
    // the lowest free one.
    std::set<int> taken;
    for (const auto& [_, r] : workers_) taken.insert(r.info.rank());
    rank = Ordinal(info.name());
    if (rank < 0 || taken.count(rank)) {
      rank = 0;
      while (taken.count(rank)) ++rank;
    }
  } else {
    rank = it->second.info.rank();
    if (it->second.info.state() == baton::v1::DEAD) {
      kind = baton::v1::Event::WORKER_REJOINED;
    } else if (it->second.info.incarnation() == info.incarnation() &&
               it->second.info.address() != info.address()) {
      // The same instance does not move while alive: someone else is
      // trying to redirect its slot.
      return absl::FailedPreconditionError(absl::StrCat("worker ", info.name(), " is alive at ",
                                                        it->second.info.address(), "; it cannot move to ",
                                                        info.address(), " while alive"));
    } else if (it->second.info.incarnation() != info.incarnation()) {
      // A live worker's slot is not anyone's for the asking: another
      // instance may take the name once this one is declared dead.
      return absl::FailedPreconditionError(absl::StrCat(
          "worker ", info.name(), " is alive (another instance, at ", it->second.info.address(),
          "); a new instance may take the name once that one stops heartbeating"));
    }
  }
  Record& r = workers_[info.name()];
  const bool restarted = !r.info.incarnation().empty() && r.info.incarnation() != info.incarnation();
  const int restarts = r.info.restarts() + (restarted ? 1 : 0);
  r.info = info;
  r.info.set_restarts(restarts);
  r.info.set_rank(rank);
  r.info.set_state(baton::v1::REGISTERED);
  r.last_heartbeat = clock_();
  if (events_ != nullptr) {
    events_->Append(WorkerEvent(kind, info.name(), rank, absl::StrCat("at ", info.address(), " pid ", info.pid())));
  }
  return rank;
}

bool WorkerRegistry::Heartbeat(const std::string& name, const std::string& incarnation) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(name);
  if (it == workers_.end() || it->second.info.state() == baton::v1::DEAD ||
      it->second.info.incarnation() != incarnation) {
    return false;
  }
  it->second.last_heartbeat = clock_();
  return true;
}

bool WorkerRegistry::DeclareDead(const std::string& name, const std::string& address, const std::string& cause) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(name);
  if (it == workers_.end() || it->second.info.state() == baton::v1::DEAD || it->second.info.address() != address) {
    return false;
  }
  it->second.info.set_state(baton::v1::DEAD);
  if (events_ != nullptr) {
    baton::v1::Event e = WorkerEvent(baton::v1::Event::WORKER_DEAD, name, it->second.info.rank(), "");
    e.set_cause(cause);
    events_->Append(std::move(e));
  }
  return true;
}

std::vector<std::string> WorkerRegistry::SweepDead() {
  std::vector<std::string> dead;
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_();
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (it->second.info.state() == baton::v1::DEAD && now - it->second.last_heartbeat > heartbeat_timeout_ + forget_after_) {
      if (events_ != nullptr) {
        events_->Append(WorkerEvent(baton::v1::Event::WORKER_FORGOTTEN, it->first, it->second.info.rank(),
                                    absl::StrCat("dead for more than ", absl::FormatDuration(forget_after_))));
      }
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& [name, r] : workers_) {
    if (r.info.state() == baton::v1::DEAD) continue;
    if (now - r.last_heartbeat > heartbeat_timeout_) {
      r.info.set_state(baton::v1::DEAD);
      dead.push_back(name);
      if (events_ != nullptr) {
        baton::v1::Event e = WorkerEvent(baton::v1::Event::WORKER_DEAD, name, r.info.rank(), "");
        e.set_cause(absl::StrFormat("no heartbeat for %.1f s (timeout %.1f s)",
                                    absl::ToDoubleSeconds(now - r.last_heartbeat),
                                    absl::ToDoubleSeconds(heartbeat_timeout_)));
        events_->Append(std::move(e));
      }
    }
  }
  return dead;
}

void WorkerRegistry::SetState(const std::vector<std::string>& names,
                              baton::v1::WorkerState state) {
  absl::MutexLock lock(&mu_);
  for (const auto& n : names) {
    auto it = workers_.find(n);
    if (it != workers_.end() && it->second.info.state() != baton::v1::DEAD) {
      it->second.info.set_state(state);
    }
  }
}

baton::v1::WorkerInfo WorkerRegistry::Snapshot(const Record& r) const {
  baton::v1::WorkerInfo info = r.info;
  info.set_heartbeat_age_s(absl::ToDoubleSeconds(clock_() - r.last_heartbeat));
  return info;
}

std::vector<baton::v1::WorkerInfo> WorkerRegistry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<baton::v1::WorkerInfo> out;
  for (const auto& [_, r] : workers_) out.push_back(Snapshot(r));
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.rank() < b.rank(); });
  return out;
}

std::vector<size_t> WorkerRegistry::DeadAmong(const google::protobuf::RepeatedPtrField<std::string>& names) const {
  std::vector<size_t> dead;
  absl::MutexLock lock(&mu_);
  for (int i = 0; i < names.size(); ++i) {
    auto it = workers_.find(names.Get(i));
    if (it == workers_.end() || it->second.info.state() == baton::v1::DEAD) dead.push_back(static_cast<size_t>(i));
  }
  return dead;
}

double WorkerRegistry::HeartbeatAge(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(name);
  return it == workers_.end() ? 0.0 : absl::ToDoubleSeconds(clock_() - it->second.last_heartbeat);
}

absl::StatusOr<baton::v1::WorkerInfo> WorkerRegistry::Get(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(name);
  if (it == workers_.end()) return absl::NotFoundError(absl::StrCat("unknown worker \"", name, "\""));
  return Snapshot(it->second);
}

}  // namespace baton
