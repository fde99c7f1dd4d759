// SPDX-License-Identifier: MIT
// One step of the executor: one walk of this rank's table row; the switch below is the whole
// algorithm, in table order. The table's slot marks say where the stagger is and which waits the
// BubbleFiller gets; the filler decides what to do in them.
#include "atlas/runtime/trainer.hpp"

#include <algorithm>
#include <thread>

namespace atlas::runtime {

StepReport Trainer::train_step(int step) {
  using sched::SlotKind;
  StepReport r;
  r.step = step;
  const bool first = m_me.stage == 0;
  const bool last = m_me.stage == m_layout.pp_size() - 1;
  const int chunks = m_table.virtual_stages;
  const double t_step = m_profiler.now();
  if (!m_emu) m_model->zero_grad();
  m_boundary->begin_step(step);
  post_embedding_recv();
  post_loss_receives();

  const auto& row = m_table.row(m_me.stage, m_me.dp);
  // The bubbles that end this rank's row: nothing after them in this step. When the next step
  // begins with our own compute (no receive to wait for), or there is no next step, they wait
  // for nothing but the table's step boundary, so they are not filled: filling them would only
  // start our next step late (the first stage's forwards: the whole pipeline's).
  std::size_t tail = row.size();
  while (tail > 0 && sched::is_bubble(row[tail - 1].kind)) --tail;
  const bool tail_waits = step + 1 < m_cfg.run.steps && !row.empty() && sched::is_recv(row.front().kind);
  for (std::size_t i = 0; i < row.size(); ++i) {
    const sched::Slot& slot = row[i];
    const auto micro = static_cast<std::size_t>(std::max(slot.micro, 0));
    const double t0 = m_profiler.now();
    double spent_prefill = 0.0;
    double norm_wait_s = 0.0;  // Optimizer: the gradient-norm sum's wait (communication, not compute)
    double sums_s = 0.0;       // a bubble before AllReduce: the gradient sums started in it
    switch (slot.kind) {
      case SlotKind::Forward: {
        if (m_emu) {  // no arithmetic: the slot's predicted time
          emulate_compute(slot.duration_ms * 1e-3);
          break;
        }
        // With model chunks (interleaved 1F1B) only the first stage's chunk 0 embeds and only the
        // last stage's last chunk has the loss; every other chunk takes and gives a boundary tensor.
        const bool embed = first && slot.chunk == 0;
        const bool head = last && slot.chunk == chunks - 1;
        const std::size_t b = micro * static_cast<std::size_t>(chunks) + static_cast<std::size_t>(slot.chunk);
        if (embed || head) m_data.train->fill(slot.micro, m_tokens.data(), m_targets.data());
        m_model->forward(slot.micro, embed ? m_tokens.data() : nullptr, head ? m_targets.data() : nullptr,
                         embed ? nullptr : &m_act_in[b], head ? nullptr : &m_act_out[b], slot.chunk);
        if (head && static_cast<int>(i) == m_last_forward) send_step_loss();
        break;
      }
      case SlotKind::Backward: {
        if (m_emu) {
          emulate_compute(slot.duration_ms * 1e-3);
          break;
        }
        // The step's last backward: each group of gradients it finishes goes into a bucket, and
        // a full bucket's DP sum starts at once (the sums run while earlier layers compute).
        const model::StageModel::GradsReady ready = [this](std::span<model::ParamTensor* const> ps) { pack_ready(ps); };
        const bool overlap = std::binary_search(m_overlap_backwards.begin(), m_overlap_backwards.end(), static_cast<int>(i));
        const bool embed = first && slot.chunk == 0;
        const bool head = last && slot.chunk == chunks - 1;
        const std::size_t b = micro * static_cast<std::size_t>(chunks) + static_cast<std::size_t>(slot.chunk);
        m_model->backward(slot.micro, head ? nullptr : &m_grad_out[b], embed ? nullptr : &m_grad_in[b],
                          overlap ? &ready : nullptr, slot.chunk);
        break;
      }
      case SlotKind::BackwardInput: {
        // Split backward (the zero-bubble slot contract, docs/schedules.md): B gives the previous
        // stage its gradient (the send follows it); the weight gradients wait for the W slot.
        if (m_emu) {
          emulate_compute(slot.duration_ms * 1e-3);
          break;
        }
        const bool embed = first && slot.chunk == 0;
        const bool head = last && slot.chunk == chunks - 1;
        const std::size_t b = micro * static_cast<std::size_t>(chunks) + static_cast<std::size_t>(slot.chunk);
        m_model->backward_input(slot.micro, head ? nullptr : &m_grad_out[b], embed ? nullptr : &m_grad_in[b],
                                slot.chunk);
        break;
      }
      case SlotKind::BackwardWeight: {
        if (m_emu) {
          emulate_compute(slot.duration_ms * 1e-3);
          break;
        }
        // A chunk's last W finishes its gradients: with train.dp_overlap its buckets start here.
        const model::StageModel::GradsReady ready = [this](std::span<model::ParamTensor* const> ps) { pack_ready(ps); };
        const bool overlap = std::binary_search(m_overlap_backwards.begin(), m_overlap_backwards.end(), static_cast<int>(i));
        m_model->backward_weight(slot.micro, overlap ? &ready : nullptr, slot.chunk);
        break;
      }
      case SlotKind::WanRecv:
      case SlotKind::LocalRecv: {
        spent_prefill = receive(step, slot, i, r);  // returns with the data in
        if (m_emu) break;  // the tensor stays in the boundary's scratch buffer
        const std::size_t b = micro * static_cast<std::size_t>(chunks) + static_cast<std::size_t>(slot.chunk);
        device::Buffer& dst = slot.flow == sched::Flow::Activation ? m_act_in[b] : m_grad_out[b];
        from_wire(dst, m_boundary->recv_buffer(slot.flow, slot.micro, slot.chunk));
        break;
      }
      case SlotKind::WanSend:
      case SlotKind::LocalSend: {
        if (!m_emu) {  // emulated: the boundary's scratch buffer goes as it is
          const std::size_t b = micro * static_cast<std::size_t>(chunks) + static_cast<std::size_t>(slot.chunk);
          const device::Buffer& src = slot.flow == sched::Flow::Activation ? m_act_out[b] : m_grad_in[b];
          to_wire(m_boundary->send_buffer(slot.flow, slot.micro, slot.chunk), src);
        }
        m_boundary->post_send(slot, static_cast<int>(i));
        break;
      }
      case SlotKind::AllReduce:
        all_reduce_gradients(wait_hook(step, slot, i, spent_prefill, r));
        m_grads_final = true;
        r.dp_buckets = m_buckets_step;
        r.dp_buckets_early = m_buckets_early;
        break;
      case SlotKind::Optimizer:
        r.grad_norm = clip_and_step(step, wait_hook(step, slot, i, spent_prefill, r), norm_wait_s);
        r.lr = model::lr_at(step, m_cfg.train, m_cfg.run.steps);
        break;
      case SlotKind::Prefill:
      case SlotKind::Idle:
        if (m_filler && (i < tail || tail_waits)) {
          // The bubble ends when the receive after it completes, before the AllReduce slot when
          // the DP sums (and the partner's half of a tied-embedding exchange) are in, before the
          // Optimizer slot when the gradient-norm sum is: the filler watches it.
          const sched::Slot* next = i + 1 < row.size() ? &row[i + 1] : nullptr;
          const bool exchange = slot.has(sched::SlotMark::ExchangeBubble) && m_embed_wan_partner >= 0;
          std::function<bool()> ended;
          if (next != nullptr && sched::is_recv(next->kind))
            ended = [this, next] { return m_boundary->test_recv(*next); };
          else if (m_filler->watches_exchange_bubbles() &&
                   (exchange || (next != nullptr && next->kind == SlotKind::AllReduce && m_dp))) {
            // Our gradients are final (every backward is behind us): the DP sums start now and,
            // once they are in (tested before every chunk and between its blocks), our half of a
            // tied-embedding exchange across the WAN leaves, so neither a DP replica nor the
            // partner waits for this bubble's prefill. The bubble lasts until the partner's half
            // is in (an exchange) or the DP sums are (otherwise); the time to start and end the
            // sums is intra-DC communication.
            const double ts = m_profiler.now();
            start_gradient_sums();
            sums_s = m_profiler.now() - ts;
            ended = [this, &sums_s, exchange] {
              if (!m_sums_ended) {
                if (!gradient_sums_done()) return false;
                const double te = m_profiler.now();
                end_gradient_sums();
                sums_s += m_profiler.now() - te;
              }
              return !exchange || m_boundary->exchange_arrived();
            };
          } else if (next != nullptr && next->kind == SlotKind::Optimizer && m_grads_final &&
                     m_filler->watches_exchange_bubbles()) {
            // The gradients are final (the AllReduce slot ran): our share of the pipeline's
            // gradient-norm sum goes now, and the bubble is filled until every rank's share is in,
            // so a rank that has its bubble here never holds the others' optimizer back.
            start_norm_sum();
            ended = [this] { return m_norm_sum.test(); };
          }
          const auto [s, tokens] = m_filler->fill(step, slot, slot.duration_ms * 1e-3, ended ? &ended : nullptr);
          spent_prefill = s;
          r.prefill_tokens += tokens;
        }
        if (slot.has(sched::SlotMark::Stagger)) {
          // A deliberate delay (the atlas stagger); every other bubble is a wait the next slot does.
          const double left = slot.duration_ms * 1e-3 - (m_profiler.now() - t0);
          if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(left));
        }
        break;
    }
    const double t1 = m_profiler.now();
    // Prefill inside the slot (a bubble, or a WAN wait of the all-reduce / optimizer) is
    // BubbleTea's time, not the slot's.
    const double own = (t1 - t0) - spent_prefill;
    r.prefill_s += spent_prefill;
    double wan_wait = 0.0, intra_wait = 0.0;  // this slot's share of r.wan_s / r.intra_s (its event's)
    switch (slot.kind) {
      case SlotKind::Forward:
      case SlotKind::Backward:
      case SlotKind::BackwardInput:
      case SlotKind::BackwardWeight:
      case SlotKind::Optimizer: {
        const double wait = std::max(0.0, norm_wait_s - spent_prefill);
        r.compute_s += own - wait;
        (m_replica_spans_dcs ? wan_wait : intra_wait) += wait;
        break;
      }
      case SlotKind::LocalRecv: intra_wait += own; break;
      case SlotKind::AllReduce: {
        // The DP sum waits on the WAN when the replicas sit in several DCs (parallel.dp_across_dcs);
        // the tied-embedding exchange with a partner in another DC always does (BubbleTea's fill
        // in its wait is prefill, not a wait).
        const double exchange = std::clamp(m_exchange_s - spent_prefill, 0.0, std::max(0.0, own));
        (m_dp_spans_dcs ? wan_wait : intra_wait) += own - exchange;
        wan_wait += exchange;
        r.exchange_s += exchange;
        r.allreduce_s += own;
        break;
      }
      case SlotKind::WanRecv: wan_wait += own; break;
      case SlotKind::Idle:
      case SlotKind::Prefill:
        r.idle_s += own - sums_s;
        (m_dp_spans_dcs ? wan_wait : intra_wait) += sums_s;
        r.allreduce_s += sums_s;
        break;
      default: break;
    }
    r.wan_s += wan_wait;
    r.intra_s += intra_wait;
    if (slot.kind != SlotKind::WanSend) {  // the boundary records WAN sends with their completion
      SlotEvent e;
      e.world_rank = m_comms.world.rank();
      e.step = step;
      e.slot_index = static_cast<int>(i);
      e.kind = static_cast<int>(slot.kind);
      e.micro = slot.micro;
      e.peer = slot.peer_stage >= 0 ? m_layout.world_rank(slot.peer_stage, m_me.dp, m_me.tp) : -1;
      e.link = slot.link;
      e.bytes = sched::is_send(slot.kind) || sched::is_recv(slot.kind) ? slot.bytes : 0;
      e.start_s = t0;
      e.end_s = t1;
      e.complete_s = t1;
      e.predicted_start_ms = slot.start_ms;
      e.predicted_ms = slot.duration_ms;
      e.wan_wait_s = wan_wait;
      e.intra_wait_s = intra_wait;
      m_profiler.record(e);
    }
  }
  r.boundary = m_boundary->end_step();
  r.loss = step_loss();
  if (m_data.train) m_data.train->advance();
  r.step_s = m_profiler.now() - t_step;
  return r;
}

Boundary::WaitHook Trainer::wait_hook(int step, const sched::Slot& slot, std::size_t index, double& spent_prefill,
                                      StepReport& r) {
  m_wait_index = -1;
  if (m_filler == nullptr || !slot.has(sched::SlotMark::FillableWait)) return {};
  return [this, step, &slot, index, &spent_prefill, &r](const std::function<bool()>& done) {
    m_wait_index = static_cast<int>(index);
    const auto [s, tokens] = m_filler->fill_wait(step, slot, m_wait_index, done);
    spent_prefill += s;
    r.prefill_tokens += tokens;
  };
}

void Trainer::wait_over() {
  if (m_wait_index < 0) return;
  m_filler->wait_ended(m_wait_index);
  m_wait_index = -1;
}

double Trainer::receive(int step, const sched::Slot& slot, std::size_t index, StepReport& r) {
  double spent = 0.0;
  if (const Boundary::WaitHook fill = wait_hook(step, slot, index, spent, r))
    fill([this, &slot] { return m_boundary->test_recv(slot); });
  m_boundary->wait_recv(slot);  // at once when the filler saw the data in
  wait_over();
  return spent;
}

}  // namespace atlas::runtime
