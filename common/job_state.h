// Which job states are final: the controller, the CLI and the SDK agree on
// it here (the status page's script says the same for the browser).
#ifndef BATON_COMMON_JOB_STATE_H_
#define BATON_COMMON_JOB_STATE_H_

#include "proto/controller.pb.h"

namespace baton {

// FINISHED, STOPPED, FAILED, or UNREADABLE (a record the controller could
// not read: nothing runs it).
inline bool IsEnded(baton::v1::JobState s) {
  return s == baton::v1::JOB_FINISHED || s == baton::v1::JOB_STOPPED || s == baton::v1::JOB_FAILED ||
         s == baton::v1::JOB_UNREADABLE;
}

}  // namespace baton

#endif  // BATON_COMMON_JOB_STATE_H_
