// Reading what `baton run` / `baton reference` / the oracle print: one flat
// JSON object per step, and the plan's theory line `baton run` writes first.
#ifndef BATON_TESTS_STEP_LINES_H_
#define BATON_TESTS_STEP_LINES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace baton::testing {

// The lines of `output` that are step objects (they start with `prefix`).
std::vector<std::string> JsonLines(const std::string& output, const std::string& prefix = "{\"step\":");
// A numeric field of a flat JSON object; NaN when absent.
double Field(const std::string& line, const std::string& key);
// A string field of a flat JSON object; "" when absent.
std::string StringField(const std::string& line, const std::string& key);

// "theory per rank: comm C B/step, state S B, peak unsharded P B"
struct TheoryLine {
  bool found = false;
  int64_t comm = 0, state = 0, peak = 0;
};
TheoryLine ParseTheory(const std::string& output);

}  // namespace baton::testing

#endif  // BATON_TESTS_STEP_LINES_H_
