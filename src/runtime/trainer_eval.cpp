// SPDX-License-Identifier: MIT
// The trainer's evaluation (Trainer::evaluate): the validation batches through the pipeline,
// stage to stage in virtual stage order, their mean loss summed over the DP replicas and sent to
// world rank 0; every wait on a peer bounded by wan.recv_timeout_s, as in a training step.
#include "atlas/runtime/trainer.hpp"

#include <exception>
#include <memory>
#include <string>

#include "atlas/core/check.hpp"
#include "atlas/mpi/tags.hpp"

namespace atlas::runtime {

double Trainer::evaluate() {
  ATLAS_ASSERT(!m_emu, "evaluate() on an emulated run (deck validation refuses train.eval_every_steps there)");
  const bool first = m_model->is_first();
  const bool last = m_model->is_last();
  const int batches = m_cfg.train.eval_batches;
  const std::size_t floats = m_model->boundary_floats();
  const std::size_t wire_bytes = floats * (m_bf16_wire ? 2 : sizeof(float));
  // The wire format (bf16 uses its first half), and the loss's sums: on the heap and never freed
  // when an exchange times out (an abandoned request may still write into them until the job
  // aborts).
  struct Buffers {
    std::vector<float> host;
    double loss = 0.0;
  };
  auto bufs = std::make_unique<Buffers>();
  bufs->host.resize(floats);
  std::vector<float>& host = bufs->host;
  struct KeepOnError {
    std::unique_ptr<Buffers>& b;
    ~KeepOnError() {
      if (std::uncaught_exceptions() > 0) (void)b.release();
    }
  } keep{bufs};
  device::Buffer in = m_backend.alloc_floats(floats);
  device::Buffer out = m_backend.alloc_floats(floats);
  double& loss = bufs->loss;
  if (m_data.val) m_data.val->rewind();
  // With model chunks a batch visits the stages once per chunk, in virtual stage order (the last
  // stage hands it back to the first): each exchange is a blocking pair along that chain.
  const int chunks = m_table.virtual_stages;
  const int pp = m_layout.pp_size();
  for (int m = 0; m < batches; ++m) {
    const int micro = 1000000 + m;  // never collides with a training micro-batch id
    if (first || last) m_data.val->fill(m, m_tokens.data(), m_targets.data());
    for (int c = 0; c < chunks; ++c) {
      const int vs = c * pp + m_me.stage;  // virtual stage
      const bool embed = vs == 0;
      const bool head = vs == chunks * pp - 1;
      if (!embed) {
        const int tag = mpi::tags::eval(m, m_cfg.train.micro_batches, (vs - 1) / pp, chunks);
        m_boundary->recv_blocking((vs - 1) % pp, tag, host.data(), wire_bytes);
        from_wire(in, host.data());
      }
      m_model->forward(micro, embed ? m_tokens.data() : nullptr, head ? m_targets.data() : nullptr,
                       embed ? nullptr : &in, head ? nullptr : &out, c);
      if (head) loss += m_model->micro_loss(micro);
      m_model->release(micro, c);
      if (!head) {
        const int tag = mpi::tags::eval(m, m_cfg.train.micro_batches, vs / pp, chunks);
        to_wire(host.data(), out);
        m_boundary->send_blocking((vs + 1) % pp, tag, host.data(), wire_bytes);
      }
    }
  }
  // The loss's sum and its way to rank 0, bounded as every wait on a peer (wait_bounded: a replica
  // or the last stage that hangs fails the job, naming the wait). Its buffer is the in-flight
  // state's, kept while an error unwinds (a sum MPI cannot cancel may still write it).
  double& wire = m_in_flight->eval_loss;
  wire = loss;
  if (last) {
    wire /= batches;
    mpi::Request sum = m_comms.dp.iallreduce_sum(std::span<double>(&wire, 1));
    wait_bounded(sum, [] { return std::string("evaluation: the validation loss's sum over the DP replicas"); });
    wire /= m_layout.dp_size();
  }
  const int reporter = m_layout.world_rank(m_layout.pp_size() - 1, 0, 0);
  const int me = m_comms.world.rank();
  if (reporter == 0) return me == 0 ? wire : 0.0;
  if (me == reporter) {
    mpi::Request send = m_comms.world.isend(std::span<const double>(&wire, 1), 0, mpi::tags::kEvalLoss);
    wait_bounded(send, [] { return std::string("evaluation: the validation loss's send to rank 0"); });
  }
  if (me == 0) {
    mpi::Request recv = m_comms.world.irecv(std::span<double>(&wire, 1), reporter, mpi::tags::kEvalLoss);
    wait_bounded(recv, [] { return std::string("evaluation: the validation loss from the last stage"); });
  }
  return wire;
}

}  // namespace atlas::runtime
