// Shared pieces of the integration tests: a local fleet from the test's
// runfiles, stopping it while checking that nothing is left behind, and the
// hard timeout every multi-process test binary arms.
#ifndef BATON_TESTS_CLUSTER_UTIL_H_
#define BATON_TESTS_CLUSTER_UTIL_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "client/local_cluster.h"
#include "grpcpp/grpcpp.h"

namespace baton::testing {

// The `baton` CLI in the runfiles.
std::string BatonBinary();
// A controller and `workers` workers; nullptr (and a test failure) if it
// could not start.
std::unique_ptr<LocalCluster> StartCluster(int workers);
// With extra flags for the controller and for every worker.
std::unique_ptr<LocalCluster> StartCluster(int workers, const std::vector<std::string>& controller_args,
                                           const std::vector<std::string>& worker_args);
pid_t PidOf(const LocalCluster& cluster, const std::string& name);

// Built with AddressSanitizer: RSS says nothing then (shadow memory and the
// quarantine of freed blocks).
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kUnderAsan = true;
#else
inline constexpr bool kUnderAsan = false;
#endif
// A channel to a daemon of `cluster` that presents the fleet's worker token
// (as the controller does to workers, and workers to the registry).
std::shared_ptr<grpc::Channel> FleetChannel(const LocalCluster& cluster, const std::string& address,
                                            const grpc::ChannelArguments& args = {});
// Stops the fleet and expects every process of it to be gone.
void StopAndExpectAllGone(LocalCluster& cluster);

}  // namespace baton::testing

#endif  // BATON_TESTS_CLUSTER_UTIL_H_
