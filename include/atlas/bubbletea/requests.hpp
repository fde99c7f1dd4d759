// SPDX-License-Identifier: MIT
// Prefill requests: read from a CSV trace (inputs/traces/*.csv) or drawn by a seeded Poisson
// generator from the deck's [bubbletea] keys, and split over the DCs' dispatchers. Pure data and
// parsing; no MPI, no device.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "atlas/deck/config.hpp"
#include "atlas/deck/schema.hpp"

namespace atlas::bubbletea {

/// One inference request: a prompt to prefill, then `max_new_tokens` to decode.
struct Request {
  int id = 0;                          ///< position in the trace / generator order (0-based)
  double arrival_s = 0.0;              ///< seconds after the job's start (the train loop's start)
  std::vector<std::int32_t> prompt;    ///< token ids in [0, bubbletea.vocab)
  int max_new_tokens = 1;              ///< tokens generated, the first one (from the prefill) included
  int dc = 0;                          ///< the DC whose dispatcher serves it (id mod DC count)
};

/// The largest request trace read (a regular file; a FIFO or a device is refused).
inline constexpr std::uint64_t kMaxTraceBytes = 256ull * 1024 * 1024;
/// The most requests a trace may hold: bubbletea.requests' limit (every rank holds every
/// request's prompt, so the count bounds its memory, not the file's size).
inline constexpr auto kMaxTraceRequests = static_cast<std::size_t>(deck::limits::kMaxRequests);
/// The most prompt tokens the requests may hold in all (deck::limits::kMaxPromptTokens, 1 GiB).
inline constexpr auto kMaxPromptTokens = static_cast<std::int64_t>(deck::limits::kMaxPromptTokens);
/// parse_trace stops reading after this many problems.
inline constexpr std::size_t kMaxTraceProblems = 20;

/// Parses a request trace. Format: one request per line, `arrival_s,prompt,max_new_tokens`;
/// `prompt` is either a token count (an integer: that many tokens drawn from `seed`) or a quoted
/// text (`"..."`, `""` for a quote inside; encoded by the byte tokenizer); `max_new_tokens` may be
/// left empty (then `default_max_new`). Blank lines and lines starting with `#` are skipped, and a
/// first line starting with `arrival` is a header. `file` names the source in messages.
/// Throws ConfigError listing every problem as "FILE:LINE: ..." (bad number, negative or
/// decreasing arrival time, empty prompt, prompt + max_new_tokens beyond `context`, a text
/// prompt with vocab < 256, a token count below 1, wrong field count); it stops reading after
/// kMaxTraceProblems of them (a file that is not a trace would list every line), and a trace of
/// more than kMaxTraceRequests requests (the generator's bubbletea.requests limit), or of more
/// than `max_prompt_tokens` prompt tokens in all, is refused.
[[nodiscard]] std::vector<Request> parse_trace(const std::string& file, const std::string& text, int vocab,
                                               int context, int default_max_new, std::uint64_t seed,
                                               std::int64_t max_prompt_tokens = kMaxPromptTokens);

/// `bubbletea.requests` requests with exponential inter-arrival times of mean 1 / rate_per_s
/// (rate 0: all arrive at t = 0), prompt lengths uniform in [prompt_tokens_min,
/// prompt_tokens_max], tokens uniform in [0, vocab), all keyed by `seed` (run.seed).
[[nodiscard]] std::vector<Request> generate_requests(const BubbleTeaCfg& cfg, std::uint64_t seed);


/// The deck's requests: the trace (when bubbletea.trace is set; the file is read here) or the
/// generator; `dc` assigned as id mod dc_count. Throws ConfigError (with FILE:LINE for trace
/// problems; naming the file when it cannot be read).
[[nodiscard]] std::vector<Request> load_requests(const Config& cfg, int dc_count);

/// Same, but `trace_text` is the trace's content (already read, e.g. broadcast by rank 0).
[[nodiscard]] std::vector<Request> load_requests(const Config& cfg, int dc_count, const std::string& trace_text);

}  // namespace atlas::bubbletea
