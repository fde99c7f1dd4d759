// SPDX-License-Identifier: MIT
// Request traces and the seeded Poisson generator (see requests.hpp).
#include "atlas/bubbletea/requests.hpp"

#include <cmath>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "atlas/core/error.hpp"
#include "atlas/core/units.hpp"
#include "atlas/deck/deck.hpp"
#include "atlas/model/data.hpp"
#include "atlas/model/rng.hpp"

namespace atlas::bubbletea {

namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

/// Splits one CSV line into fields; a field in double quotes may hold commas and "" for a quote.
/// `quoted[i]` says whether field i was quoted. Returns false on an unterminated quote.
bool split_csv(const std::string& line, std::vector<std::string>& fields, std::vector<bool>& quoted) {
  fields.clear();
  quoted.clear();
  std::size_t i = 0;
  while (true) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    std::string field;
    bool q = false;
    if (i < line.size() && line[i] == '"') {
      q = true;
      ++i;
      bool closed = false;
      while (i < line.size()) {
        if (line[i] == '"') {
          if (i + 1 < line.size() && line[i + 1] == '"') {
            field += '"';
            i += 2;
            continue;
          }
          ++i;
          closed = true;
          break;
        }
        field += line[i++];
      }
      if (!closed) return false;
      while (i < line.size() && line[i] != ',') {
        if (line[i] != ' ' && line[i] != '\t' && line[i] != '\r') return false;  // junk after the quote
        ++i;
      }
    } else {
      while (i < line.size() && line[i] != ',') field += line[i++];
      field = trim(field);
    }
    fields.push_back(field);
    quoted.push_back(q);
    if (i >= line.size()) break;
    ++i;  // the comma
  }
  return true;
}

/// Token ids of a synthetic prompt: uniform in [0, vocab), keyed by (seed, request id).
std::vector<std::int32_t> synthetic_prompt(std::uint64_t seed, int id, int tokens, int vocab) {
  const std::uint64_t key = model::rng::key(seed, fmt::format("bubbletea.prompt.{}", id));
  std::vector<std::int32_t> out(static_cast<std::size_t>(tokens));
  for (int i = 0; i < tokens; ++i)
    out[static_cast<std::size_t>(i)] =
        static_cast<std::int32_t>(model::rng::bits(key, static_cast<std::uint64_t>(i)) % static_cast<std::uint64_t>(vocab));
  return out;
}

}  // namespace

std::vector<Request> parse_trace(const std::string& file, const std::string& text, int vocab, int context,
                                 int default_max_new, std::uint64_t seed, std::int64_t max_prompt_tokens) {
  std::vector<Request> out;
  ProblemList problems;
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  bool first_content = true;
  double last_arrival = 0.0;
  std::int64_t held = 0;  // prompt tokens of the requests read so far
  std::vector<std::string> f;
  std::vector<bool> quoted;
  while (std::getline(in, line)) {
    ++lineno;
    if (problems.items().size() >= kMaxTraceProblems) {
      problems.add(fmt::format("{}:{}: stopped reading after {} problems; fix those and run again", file, lineno,
                               kMaxTraceProblems));
      break;
    }
    const std::string t = trim(line);
    if (t.empty() || t[0] == '#') continue;
    const std::string where = fmt::format("{}:{}: ", file, lineno);
    if (out.size() >= kMaxTraceRequests) {
      problems.add(where + fmt::format("more than {} requests (the most a trace may hold, as bubbletea.requests)\n"
                                       "  hint: split the trace over several runs",
                                       kMaxTraceRequests));
      break;
    }
    if (first_content) {
      first_content = false;
      if (t.rfind("arrival", 0) == 0) continue;  // header
    }
    if (!split_csv(t, f, quoted)) {
      problems.add(where + "unterminated or malformed quoted prompt");
      continue;
    }
    if (f.size() < 2 || f.size() > 3) {
      problems.add(where + fmt::format("expected 'arrival_s,prompt,max_new_tokens' (2 or 3 fields), found {}", f.size()));
      continue;
    }
    Request r;
    r.id = static_cast<int>(out.size());
    bool ok = true;
    const auto arrival = units::parse_double(f[0]);
    if (!arrival || !std::isfinite(*arrival)) {
      problems.add(where + fmt::format("arrival time '{}' is not a number (seconds after the job's start)", f[0]));
      ok = false;
    } else if (*arrival < 0) {
      problems.add(where + fmt::format("arrival time {} is negative (times are seconds after the job's start)", f[0]));
      ok = false;
    } else if (!out.empty() && *arrival < last_arrival) {
      problems.add(where + fmt::format("arrival time {} is earlier than the previous request's {} (the trace must "
                                       "be sorted by arrival time)",
                                       f[0], last_arrival));
      ok = false;
    } else {
      r.arrival_s = *arrival;
    }
    if (quoted[1]) {
      if (vocab < model::ByteTokenizer::kVocab) {
        problems.add(where + fmt::format("a text prompt needs the byte tokenizer's 256 symbols, but bubbletea.vocab = {}"
                                         "\n  hint: give a token count instead, or set bubbletea.vocab = 256",
                                         vocab));
        ok = false;
      } else {
        r.prompt = model::ByteTokenizer::encode(f[1]);
        if (r.prompt.empty()) {
          problems.add(where + "the prompt text is empty");
          ok = false;
        }
      }
    } else {
      const auto count = units::parse_int(f[1]);
      if (!count) {
        problems.add(where + fmt::format("prompt '{}' is neither a token count nor a quoted text", f[1]));
        ok = false;
      } else if (*count < 1 || *count > context) {
        problems.add(where + fmt::format("prompt of {} tokens is outside [1, bubbletea.context = {}]", *count, context));
        ok = false;
      } else if (held + *count > max_prompt_tokens) {
        problems.add(where + fmt::format("the prompts up to here hold {} tokens, more than {} (4 bytes each on every rank)"
                                         "\n  hint: split the trace over several runs, or shorten the prompts",
                                         held + *count, max_prompt_tokens));
        break;
      } else {
        r.prompt = synthetic_prompt(seed, r.id, static_cast<int>(*count), vocab);
      }
    }
    r.max_new_tokens = default_max_new;
    if (f.size() == 3 && !f[2].empty()) {
      const auto m = units::parse_int(f[2]);
      if (!m || *m < 1 || *m > context) {
        problems.add(where + fmt::format("max_new_tokens '{}' is not an integer in [1, {}]", f[2], context));
        ok = false;
      } else {
        r.max_new_tokens = static_cast<int>(*m);
      }
    }
    if (ok && static_cast<int>(r.prompt.size()) + r.max_new_tokens > context) {
      problems.add(where + fmt::format("prompt of {} tokens plus max_new_tokens {} = {} exceeds bubbletea.context = {}"
                                       "\n  hint: shorten the prompt or raise bubbletea.context",
                                       r.prompt.size(), r.max_new_tokens, r.prompt.size() + r.max_new_tokens, context));
      ok = false;
    }
    if (ok) {
      last_arrival = r.arrival_s;
      held += static_cast<std::int64_t>(r.prompt.size());
      out.push_back(std::move(r));
    } else if (arrival && std::isfinite(*arrival) && *arrival >= last_arrival) {
      last_arrival = *arrival;  // keep the sort check meaningful after a bad line
    }
  }
  problems.throw_if_any();
  if (out.empty()) throw ConfigError(file + ": the request trace holds no request");
  return out;
}

std::vector<Request> generate_requests(const BubbleTeaCfg& cfg, std::uint64_t seed) {
  std::vector<Request> out;
  const std::uint64_t k_arrival = model::rng::key(seed, "bubbletea.arrival");
  const std::uint64_t k_len = model::rng::key(seed, "bubbletea.prompt_len");
  double t = 0.0;
  const int span = cfg.prompt_tokens_max - cfg.prompt_tokens_min + 1;
  for (int i = 0; i < cfg.requests; ++i) {
    Request r;
    r.id = i;
    if (cfg.rate_per_s > 0) {
      const double u = model::rng::uniform(k_arrival, static_cast<std::uint64_t>(i));
      t += -std::log1p(-u) / cfg.rate_per_s;
    }
    r.arrival_s = t;
    const int len = cfg.prompt_tokens_min +
                    static_cast<int>(model::rng::bits(k_len, static_cast<std::uint64_t>(i)) % static_cast<std::uint64_t>(span));
    r.prompt = synthetic_prompt(seed, i, len, cfg.vocab);
    r.max_new_tokens = cfg.max_new_tokens;
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<Request> load_requests(const Config& cfg, int dc_count, const std::string& trace_text) {
  const auto& bt = cfg.bubbletea;
  const auto seed = static_cast<std::uint64_t>(cfg.run.seed);
  std::vector<Request> reqs =
      bt.trace.empty() ? generate_requests(bt, seed)
                       : parse_trace(bt.trace, trace_text, bt.vocab, bt.context, bt.max_new_tokens, seed);
  ProblemList problems;
  for (auto& r : reqs) {
    r.dc = dc_count > 0 ? r.id % dc_count : 0;
    if (static_cast<int>(r.prompt.size()) + r.max_new_tokens > bt.context)
      problems.add(fmt::format("request {}: prompt of {} tokens plus {} new tokens exceeds bubbletea.context = {}", r.id,
                               r.prompt.size(), r.max_new_tokens, bt.context));
  }
  problems.throw_if_any();
  return reqs;
}

std::vector<Request> load_requests(const Config& cfg, int dc_count) {
  std::string text;
  if (!cfg.bubbletea.trace.empty()) {
    // A regular file of bounded size: a FIFO or a device named here must not block or fill memory.
    try {
      text = deck::read_text_file(cfg.bubbletea.trace, kMaxTraceBytes, "request trace");
    } catch (const ConfigError& e) {
      throw ConfigError("bubbletea.trace: " + e.problems().front());
    }
  }
  return load_requests(cfg, dc_count, text);
}

}  // namespace atlas::bubbletea
