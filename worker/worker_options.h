// What a worker daemon is started with (its flags, worker/worker_main.cc),
// shared by the parts of its service (worker/worker_service.h).
#ifndef BATON_WORKER_WORKER_OPTIONS_H_
#define BATON_WORKER_WORKER_OPTIONS_H_

#include <cstdint>
#include <string>

#include "common/security.h"

namespace baton {

class WorkerMetrics;  // worker/worker_metrics.h

struct WorkerOptions {
  // Checkpoint paths in requests resolve under it (common/file_root.h).
  std::string file_root = "/nonexistent";
  // So do the token files a job's data names.
  std::string data_root = "/nonexistent";
  // Who may call the Worker service (the fleet's worker token).
  Authenticator auth;
  // Steps are counted here (nullptr: nowhere).
  WorkerMetrics* metrics = nullptr;
  // For tests that kill a worker mid-save: sleep this long before each
  // piece a save writes.
  int64_t testing_write_delay_ms = 0;
  // Tests only: every step's compute takes this fraction more (a slow rank).
  double testing_slow_compute = 0;
  // What this worker presents to its peers when it reads their retained
  // state, and its step channels' TLS: the fleet's worker token and TLS
  // (none: plaintext, no token).
  Credentials fleet_credentials;
  // gloo groups whose ranks share this host move all-reduce, all-gather
  // and reduce-scatter through shared memory (GlooOptions::shared_memory).
  bool gloo_shared_memory = true;
  // The GPU every NCCL group of this worker uses (NcclOptions::device_index):
  // the worker's, never a group rank's.
  int cuda_device = 0;
  // What its jobs compute on: "cpu" or "cuda:N" (--device, resolved).
  std::string device = "cpu";
  // Offer each mesh's controller a step channel (worker/step_channel.h),
  // inside TLS when fleet_credentials have it.
  bool step_channel = true;
};

}  // namespace baton

#endif  // BATON_WORKER_WORKER_OPTIONS_H_
