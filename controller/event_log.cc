#include "controller/event_log.h"

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace baton {
namespace {

// At most `limit` bytes of `s`, cut at a UTF-8 character boundary (a string
// field must stay valid UTF-8 for every client that parses the event).
std::string Cut(const std::string& s, size_t limit, const char* mark) {
  if (s.size() <= limit) return s;
  size_t end = limit;
  while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) --end;
  return s.substr(0, end) + mark;
}

}  // namespace

void EventLog::Append(baton::v1::Event e) {
  e.set_worker(Cut(e.worker(), kMaxNameBytes, ""));
  e.set_job_id(Cut(e.job_id(), kMaxNameBytes, ""));
  e.set_mesh_id(Cut(e.mesh_id(), kMaxNameBytes, ""));
  e.set_detail(Cut(e.detail(), kMaxMessageBytes, "..."));
  e.set_cause(Cut(e.cause(), kMaxMessageBytes, "..."));
  // Logged before it is numbered: stderr is not written under the lock
  // readers take.
  LogEvent(baton::v1::Event::Kind_Name(e.kind()), e.worker(), e.rank(), DescribeEvent(e));
  Add(std::move(e));
}

baton::v1::Event WorkerEvent(baton::v1::Event::Kind kind, const std::string& worker, int rank,
                             const std::string& detail) {
  baton::v1::Event e;
  e.set_kind(kind);
  e.set_worker(worker);
  e.set_rank(rank);
  e.set_detail(detail);
  return e;
}

baton::v1::Event MeshEvent(baton::v1::Event::Kind kind, const baton::v1::Mesh& mesh, const std::string& cause) {
  baton::v1::Event e;
  e.set_kind(kind);
  e.set_rank(-1);
  e.set_mesh_id(mesh.mesh_id());
  e.set_job_id(mesh.job_id());
  if (kind == baton::v1::Event::MESH_ABORTED) {
    e.set_cause(cause);
  } else {
    e.set_detail(cause);
  }
  return e;
}

baton::v1::Event JobEvent(baton::v1::Event::Kind kind, const std::string& job_id, int step, const std::string& detail,
                          const std::string& cause) {
  baton::v1::Event e;
  e.set_kind(kind);
  e.set_rank(-1);
  e.set_job_id(job_id);
  e.set_step(step);
  e.set_detail(detail);
  e.set_cause(cause);
  return e;
}

std::string DescribeEvent(const baton::v1::Event& e) {
  std::string s;
  auto field = [&](const char* name, const std::string& value) {
    if (!value.empty()) absl::StrAppend(&s, s.empty() ? "" : " ", name, "=", value);
  };
  field("worker", e.worker());
  field("job", e.job_id());
  field("mesh", e.mesh_id());
  if (e.step() > 0) field("step", absl::StrCat(e.step()));
  if (!e.detail().empty()) absl::StrAppend(&s, s.empty() ? "" : ": ", e.detail());
  if (!e.cause().empty()) absl::StrAppend(&s, s.empty() ? "" : " ", "(cause: ", e.cause(), ")");
  return s;
}

}  // namespace baton
