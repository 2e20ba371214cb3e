// What the checkpoint tests share (tests/checkpoint_test.cc,
// tests/checkpoint_faults_test.cc): a fleet of real daemons whose checkpoints
// live under one root in the test's temporary directory, and the small
// decoder they save and load.
#ifndef BATON_TESTS_CHECKPOINT_FLEET_H_
#define BATON_TESTS_CHECKPOINT_FLEET_H_

#include <memory>
#include <string>
#include <vector>

#include "client/client.h"
#include "client/local_cluster.h"
#include "proto/job.pb.h"

namespace baton::testing {

// The checkpoint root ($TEST_TMPDIR/root), made on first use.
std::string CheckpointRoot();
// `workers` workers and a controller, all with --checkpoint_root=CheckpointRoot().
std::unique_ptr<LocalCluster> CheckpointFleet(int workers, std::vector<std::string> worker_args = {});
// A client of `fleet`'s controller (nullptr, and a failed expectation, when it cannot connect).
std::unique_ptr<Client> ConnectTo(const LocalCluster& fleet);
// A small decoder (odd-sized, so pieces are uneven) on `mesh` with `plan`.
baton::v1::JobSpec CheckpointDecoder(const std::string& mesh, const std::string& plan, int steps = 10);
// CheckpointDecoder under FSDP over dp=`dp`.
baton::v1::JobSpec FsdpDecoder(int dp, int steps = 10);

}  // namespace baton::testing

#endif  // BATON_TESTS_CHECKPOINT_FLEET_H_
