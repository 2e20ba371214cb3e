#include "strategies/grad_reductions.h"

#include <algorithm>
#include <utility>

namespace baton {

using baton::v1::Instruction;

GradReductions::GradReductions(Options options, const ModelLayout& model, std::set<std::string> partial,
                               baton::v1::Program* program)
    : options_(std::move(options)), model_(model), partial_(std::move(partial)), program_(program) {}

std::deque<GradReductions::Link> GradReductions::LinksOf(int unit) const {
  std::deque<Link> links;
  if (!options_.shard_axis.empty()) links.push_back({Instruction::REDUCE_SCATTER_GRADS, options_.shard_axis, Instruction::AVG});
  bool partial = false;
  for (const ParamInfo& p : model_.units[unit].params) partial |= partial_.count(p.name) > 0;
  if (partial && !options_.partial_axis.empty()) {
    links.push_back({Instruction::ALL_REDUCE_GRADS, options_.partial_axis, Instruction::SUM});
  }
  if (!options_.replicate_axis.empty()) {
    links.push_back({Instruction::ALL_REDUCE_GRADS, options_.replicate_axis, Instruction::AVG});
  }
  return links;
}

int64_t GradReductions::GradBytes(int unit) const { return 4 * model_.units[unit].numel(); }

void GradReductions::UnitDone(int unit) {
  std::deque<Link> links = LinksOf(unit);
  if (links.empty()) return;
  if (options_.bucket_bytes <= 0 || links.front().op != Instruction::ALL_REDUCE_GRADS) {
    Start(Chain{{unit}, std::move(links)});
    return;
  }
  if (!bucket_.units.empty() && !(bucket_.rest == links)) FlushBucket();  // a bucket shares one chain
  bucket_.units.push_back(unit);
  bucket_.rest = std::move(links);
  bucket_bytes_ += GradBytes(unit);
  // The step's first bucket closes at 1 MiB, as DDP's: the last units'
  // gradients start on the wire while the rest of backward computes.
  const int64_t cap = buckets_ == 0 ? std::min(options_.bucket_bytes, kFirstBucketBytes) : options_.bucket_bytes;
  if (bucket_bytes_ >= cap) FlushBucket();
}

void GradReductions::FlushBucket() {
  if (bucket_.units.empty()) return;
  Chain chain = std::move(bucket_);
  bucket_ = Chain{};
  bucket_bytes_ = 0;
  ++buckets_;
  Start(std::move(chain));
}

void GradReductions::Start(Chain chain) {
  Advance();  // what is in flight ran while this backward computed
  IssueNext(chain);
  if (options_.overlap) {
    in_flight_.push_back(std::move(chain));
    return;
  }
  for (;;) {
    Wait(chain);
    if (chain.rest.empty()) return;
    IssueNext(chain);
  }
}

void GradReductions::Wait(const Chain& chain) {
  Instruction* wait = program_->add_instructions();
  wait->set_op(Instruction::WAIT_GRADS);
  wait->set_unit(chain.units[0]);
}

void GradReductions::IssueNext(Chain& chain) {
  const Link link = chain.rest.front();
  chain.rest.pop_front();
  Instruction* ins = program_->add_instructions();
  ins->set_op(link.op);
  ins->set_unit(chain.units[0]);
  ins->add_axes(link.axis);
  if (link.op == Instruction::REDUCE_SCATTER_GRADS) {
    // Its packed copy is taken at issue: the compute gradients can go.
    if (options_.free_grads) {
      Instruction* free = program_->add_instructions();
      free->set_op(Instruction::FREE_GRADS);
      free->set_unit(chain.units[0]);
    }
    return;
  }
  ins->set_reduce(link.reduce);
  for (size_t i = 1; i < chain.units.size(); ++i) ins->add_bucket(chain.units[i]);
}

void GradReductions::Advance() {
  std::vector<Chain> still;
  for (Chain& chain : in_flight_) {
    Wait(chain);
    if (chain.rest.empty()) continue;
    IssueNext(chain);
    still.push_back(std::move(chain));
  }
  in_flight_ = std::move(still);
}

void GradReductions::Finish() {
  FlushBucket();
  while (!in_flight_.empty()) Advance();
}

}  // namespace baton
