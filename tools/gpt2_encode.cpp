// SPDX-License-Identifier: MIT
// atlas-gpt2-encode: encodes files with atlas's GPT-2 BPE tokenizer, for the equivalence test
// against the reference encoders (tests/tokenizer/gpt2_equivalence.js) and the benchmark.
//   atlas-gpt2-encode [--dir DIR] FILE...          per file: "# NAME COUNT" then the ids, one line
//                                                  (and checks decode(encode(text)) == text)
//   atlas-gpt2-encode [--dir DIR] --bench FILE...  encodes the files' concatenation once with a
//                                                  cold cache; prints tokens, seconds, tokens/s
//   atlas-gpt2-encode [--dir DIR] --bench-long-runs  runs of 1,000 to 50,000 random letters (one
//                                                  word piece each) merged by encoder.py's rounds
//                                                  and by the heap, side by side: seconds, ratio,
//                                                  and whether the ids agree
// Exit 0 on success, 1 on a round-trip mismatch, 2 on bad arguments or files.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "atlas/core/error.hpp"
#include "atlas/model/gpt2_tokenizer.hpp"

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw atlas::ConfigError(fmt::format("cannot read '{}'\n  hint: check the path", path));
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "data/gpt2";
  bool bench = false, long_runs = false;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else if (a == "--bench") bench = true;
    else if (a == "--bench-long-runs") long_runs = true;
    else if (a == "--help" || a == "-h") {
      std::printf("usage: atlas-gpt2-encode [--dir DIR] [--bench] FILE... | --bench-long-runs\n"
                  "  FILE...: per file '# NAME COUNT' then its GPT-2 BPE ids on one line (decode checked)\n"
                  "  --dir DIR: encoder.json and vocab.bpe (data/gpt2)\n"
                  "  --bench: the files' concatenation once, cold cache: tokens, seconds, tokens/s\n"
                  "  --bench-long-runs: long word pieces by encoder.py's rounds and by the heap, side by side\n");
      return 0;
    } else if (a.rfind("--", 0) == 0) {
      std::fprintf(stderr, "atlas-gpt2-encode: unknown option '%s'\n  usage: atlas-gpt2-encode "
                           "[--dir DIR] [--bench] FILE... | --bench-long-runs\n", a.c_str());
      return 2;
    } else files.push_back(a);
  }
  if (files.empty() && !long_runs) {
    std::fprintf(stderr, "atlas-gpt2-encode: no input files\n  usage: atlas-gpt2-encode [--dir DIR] "
                         "[--bench] FILE...\n");
    return 2;
  }
  try {
    atlas::model::Gpt2Tokenizer tok(dir);
    if (long_runs) {
      // `tok` merges with the heap, `rounds` in encoder.py's rounds; pieces this long are not cached.
      atlas::model::Gpt2Tokenizer rounds(dir);
      tok.set_heap_bpe_min_bytes(0);
      rounds.set_heap_bpe_min_bytes(std::numeric_limits<std::size_t>::max());
      std::mt19937 rng(7);
      std::uniform_int_distribution<int> letter(0, 25);
      bool same = true;
      for (const int n : {1000, 5000, 20000, 50000}) {
        std::string run;
        for (int k = 0; k < n; ++k) run += static_cast<char>('a' + letter(rng));
        double secs[2];
        std::vector<std::int32_t> ids[2];
        for (int heap = 0; heap < 2; ++heap) {
          const auto t0 = std::chrono::steady_clock::now();
          ids[heap] = (heap ? tok : rounds).encode(run);
          secs[heap] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }
        same = same && ids[0] == ids[1];
        fmt::print("{:>6} letters: rounds {:.4f} s, heap {:.4f} s, rounds / heap {:.1f}; {} tokens, {}\n", n,
                   secs[0], secs[1], secs[0] / secs[1], ids[1].size(), ids[0] == ids[1] ? "same ids" : "IDS DIFFER");
      }
      return same ? 0 : 1;
    }
    if (bench) {
      std::string text;
      for (const auto& f : files) text += slurp(f);
      const auto t0 = std::chrono::steady_clock::now();
      const auto ids = tok.encode(text);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      fmt::print("atlas: {} bytes, {} tokens in {:.3f} s = {:.0f} tokens/s\n", text.size(), ids.size(),
                 s, static_cast<double>(ids.size()) / s);
      return 0;
    }
    std::string out;
    int bad = 0;
    for (const auto& f : files) {
      const std::string text = slurp(f);
      const auto ids = tok.encode(text);
      if (tok.decode(ids) != text) {
        std::fprintf(stderr, "atlas-gpt2-encode: decode(encode(text)) != text for '%s'\n", f.c_str());
        ++bad;
      }
      out += fmt::format("# {} {}\n{}\n", f, ids.size(), fmt::join(ids, " "));
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    return bad == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "atlas-gpt2-encode: %s\n", e.what());
    return 2;
  }
}
