#include "tests/step_lines.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace baton::testing {

std::vector<std::string> JsonLines(const std::string& output, const std::string& prefix) {
  std::vector<std::string> lines;
  for (absl::string_view l : absl::StrSplit(output, '\n')) {
    if (absl::StartsWith(l, prefix)) lines.emplace_back(l);
  }
  return lines;
}

double Field(const std::string& line, const std::string& key) {
  const std::string k = "\"" + key + "\":";
  auto pos = line.find(k);
  if (pos == std::string::npos) return NAN;
  double v = NAN;
  auto end = line.find_first_of(",}", pos);
  (void)absl::SimpleAtod(line.substr(pos + k.size(), end - pos - k.size()), &v);
  return v;
}

std::string StringField(const std::string& line, const std::string& key) {
  const std::string k = "\"" + key + "\": \"";
  auto pos = line.find(k);
  if (pos == std::string::npos) return "";
  auto end = line.find('"', pos + k.size());
  return line.substr(pos + k.size(), end - pos - k.size());
}

TheoryLine ParseTheory(const std::string& output) {
  TheoryLine t;
  auto pos = output.find("theory per rank: ");
  if (pos == std::string::npos) return t;
  long long comm = 0, state = 0, peak = 0;
  t.found = std::sscanf(output.c_str() + pos, "theory per rank: comm %lld B/step, state %lld B, peak unsharded %lld B",
                        &comm, &state, &peak) == 3;
  t.comm = comm;
  t.state = state;
  t.peak = peak;
  return t;
}

double Fp32DriftBound(double torch_drift) { return kFp32DriftFactor * std::max(torch_drift, kFp32DriftFloor); }

LossComparison CompareLosses(const std::map<int, double>& got, const std::map<int, double>& expected) {
  LossComparison c;
  for (const auto& [step, loss] : got) {
    auto it = expected.find(step);
    if (it == expected.end()) continue;
    c.worst = std::max(c.worst, std::abs(loss - it->second) / std::abs(it->second));
    ++c.compared;
  }
  return c;
}

}  // namespace baton::testing
