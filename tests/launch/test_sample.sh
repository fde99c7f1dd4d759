#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `atlas sample` with the binary (README, "Sampling from a checkpoint"): a trained byte-model
# checkpoint, exported with atlas export, is the reference's input; GPT-2's forward pass written
# out in python (tests/hf/check_sample.py over tests/hf/gpt2_reference.py) checks every chosen
# token's logit (window slides past the context included) and that greedy and top-k pick what
# they must; seeds reproduce and differ; the GPT-2 tokenizer path on a tiny imported model with
# the real vocabulary (prompt ids as tiktoken's, <|endoftext|> start and stop); every bad input
# ends with its exit code and a message with the fix. Loopback only.
# usage: test_sample.sh SOURCE_DIR ATLAS_BIN
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
launch_setup test_sample.sh sample-test "$@"
PY=/usr/bin/python3
MPI=(mpirun -np 2 --mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
atlas() { timeout 120 "$ATLAS_BIN" "$@"; }
samples_of() { $PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["samples"])' "$1"; }

# A small byte model (context 32, so 80 tokens slide the window twice), 30 steps.
timeout 180 "${MPI[@]}" "$ATLAS_BIN" train inputs/default.deck "parallel.stages_per_dc=1 1" parallel.dp_size=1 \
  model.layers=2 model.hidden=64 model.heads=4 model.seq_len=32 run.steps=30 ckpt.every_steps=30 \
  train.eval_every_steps=0 run.log_every_steps=10 run.out_dir="$T" run.name=byte > "$T/train.out" 2>&1
CKPT=$T/byte/ckpt/step-000030.h5
check "the run wrote its checkpoint" test -f "$CKPT"
check "export for the reference" to "$T/export.out" atlas export "$CKPT" --format hf --out "$T/hf"

check "greedy: exit 0" to "$T/greedy.out" atlas sample "$CKPT" --prompt "The jury" --tokens 80 --temperature 0 --json "$T/greedy.json"
check "greedy: the text starts with the prompt" grep -q "^The jury" "$T/greedy.out"
check "greedy: the summary line" grep -Eq "^# 1 sample\(s\), 80 new tokens in .* s \(.* tokens/s on host\); prompt 8 tokens" "$T/greedy.out"
check "greedy: every token and logit as GPT-2's forward pass on the export says (window slides included)" \
  $PY tests/hf/check_sample.py "$T/hf" "$T/greedy.json" 1e-4
check "top-k 4 at temperature 1.3, two samples: exit 0" \
  to "$T/topk.out" atlas sample "$CKPT" --prompt "He " --tokens 60 --temperature 1.3 --top-k 4 --samples 2 --json "$T/topk.json"
check "top-k 4: every draw rebuilt from the reference logits" $PY tests/hf/check_sample.py "$T/hf" "$T/topk.json" 1e-4
check "top-p 0.9: exit 0" to "$T/topp.out" atlas sample "$CKPT" --prompt "He " --tokens 60 --top-p 0.9 --json "$T/topp.json"
check "top-p 0.9: every draw rebuilt from the reference logits" $PY tests/hf/check_sample.py "$T/hf" "$T/topp.json" 1e-4
check "temperature 0.7 alone: exit 0" to "$T/temp.out" atlas sample "$CKPT" --prompt "She " --tokens 60 --temperature 0.7 --json "$T/temp.json"
check "temperature 0.7: every draw rebuilt from the reference logits" $PY tests/hf/check_sample.py "$T/hf" "$T/temp.json" 1e-4
check "top-k 1 at temperature 1 is greedy" to "$T/k1.out" atlas sample "$CKPT" --prompt "The jury" --tokens 80 --top-k 1 --json "$T/k1.json"
check "... the same ids" test "$(samples_of "$T/k1.json")" == "$(samples_of "$T/greedy.json")"

# Seeds: the same seed gives the same text; another seed another; sample 2 of a run is its own
# stream (the same as sample 2 of another run with the seed).
atlas sample "$CKPT" --prompt "A" --tokens 40 --seed 5 --samples 2 --json "$T/s5a.json" > "$T/s5a.out" 2>&1
atlas sample "$CKPT" --prompt "A" --tokens 40 --seed 5 --samples 2 --json "$T/s5b.json" > "$T/s5b.out" 2>&1
atlas sample "$CKPT" --prompt "A" --tokens 40 --seed 6 --samples 2 --json "$T/s6.json" > "$T/s6.out" 2>&1
check "seed 5 twice: the same samples" test "$(samples_of "$T/s5a.json")" == "$(samples_of "$T/s5b.json")"
check "seed 5 and seed 6: other samples" test "$(samples_of "$T/s5a.json")" != "$(samples_of "$T/s6.json")"
check "seed 5: its two samples differ" $PY -c 'import json,sys; s=json.load(open(sys.argv[1]))["samples"]; sys.exit(s[0] == s[1])' "$T/s5a.json"
check "the text printed is the same both times" cmp <(grep -av "tokens/s" "$T/s5a.out") <(grep -av "tokens/s" "$T/s5b.out")
printf 'The jury' > "$T/prompt.txt"
check "--prompt-file: as --prompt" to "$T/pf.out" atlas sample "$CKPT" --prompt-file "$T/prompt.txt" --tokens 80 --temperature 0 --json "$T/pf.json"
check "... the same ids" test "$(samples_of "$T/pf.json")" == "$(samples_of "$T/greedy.json")"

# The GPT-2 tokenizer on a tiny model with the real vocabulary, imported from a Hugging Face
# directory (tests/hf/make_gpt2.py): "Hello world" is tiktoken's [15496, 995].
$PY tests/hf/make_gpt2.py "$T/g2" random && $PY tests/hf/make_gpt2.py "$T/g2eot" eot
check "import of the gpt2-vocabulary model" to "$T/g2import.out" atlas import --format hf "$T/g2" --out "$T/g2ck"
check "import of the <|endoftext|> model" to "$T/g2eimport.out" atlas import --format hf "$T/g2eot" --out "$T/g2eck"
G2=$T/g2ck/step-000000.h5
check "gpt2: exit 0" to "$T/g2.out" atlas sample "$G2" --prompt "Hello world" --tokens 40 --temperature 0 --json "$T/g2.json"
check "gpt2: named in the header" grep -q "vocab 50257, gpt2 tokenizer" "$T/g2.out"
check "gpt2: the prompt's ids are GPT-2's" $PY -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))["prompt_ids"] != [15496, 995])' "$T/g2.json"
check "gpt2: the reference agrees (window slides at context 16)" $PY tests/hf/check_sample.py "$T/g2" "$T/g2.json" 1e-4
check "gpt2: no prompt starts at <|endoftext|>" to "$T/g2empty.out" atlas sample "$G2" --tokens 3 --json "$T/g2empty.json"
check "... prompt_ids [50256]" $PY -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))["prompt_ids"] != [50256])' "$T/g2empty.json"
G2E=$T/g2eck/step-000000.h5
check "gpt2: a sample stops at <|endoftext|>" to "$T/eot.out" atlas sample "$G2E" --prompt "Hello" --tokens 10 --json "$T/eot.json"
check "... after one token" test "$(samples_of "$T/eot.json")" == "[[50256]]"
check "... and says so" grep -q "^# <|endoftext|>" "$T/eot.out"
check "--ignore-eot goes on" to "$T/noeot.out" atlas sample "$G2E" --prompt "Hello" --tokens 4 --ignore-eot --json "$T/noeot.json"
check "... to --tokens" test "$(samples_of "$T/noeot.json")" == "[[50256, 50256, 50256, 50256]]"

# A checkpoint with a NaN (tests/hf/make_gpt2.py nan, imported): exit 2 naming the token.
$PY tests/hf/make_gpt2.py "$T/gnan" nan
check "import of the NaN model" to "$T/gnimport.out" atlas import --format hf "$T/gnan" --out "$T/gnck"
check "NaN logits: exit 2 naming the checkpoint, sample and token, with the fix" exits_with nan 2 \
  "'$T/gnck/step-000000.h5', sample 1, new token 1: the model's logit for token 0 is nan" \
  atlas sample "$T/gnck/step-000000.h5" --prompt hi --tokens 3

check "a byte model with --ignore-eot: runs, with a note that it is ignored" to "$T/ignored.out" \
  atlas sample "$CKPT" --prompt x --tokens 2 --ignore-eot
check "... the note" grep -q "note: --ignore-eot is for a gpt2-tokenizer model; '$CKPT' reads bytes, so it is ignored" "$T/ignored.out"

# Bad input: exit code 1 (usage) or 2 (config), the message names what and the fix.
check "under mpirun -np 2: exit 1" exits_with np2 1 "atlas sample runs as one process \(started with 2\); run it without mpirun" \
  timeout 60 "${MPI[@]}" "$ATLAS_BIN" sample "$CKPT" --prompt x
check "a missing checkpoint: exit 2 naming it" exits_with missing 2 "$T/nope.h5" atlas sample "$T/nope.h5" --prompt x
check "a negative temperature: exit 1" exits_with temp 1 "atlas sample: temperature -1 must be a finite number >= 0" \
  atlas sample "$CKPT" --prompt x --temperature -1
check "a word for a temperature: exit 1" exits_with temp_word 1 "--temperature expects a number, got 'hot'" \
  atlas sample "$CKPT" --prompt x --temperature hot
check "top-p 0: exit 1" exits_with topp 1 "top-p 0 must be in \(0, 1\]" atlas sample "$CKPT" --prompt x --top-p 0
check "top-k -1: exit 1" exits_with topk 1 "--top-k expects an integer >= 0, got '-1'" atlas sample "$CKPT" --prompt x --top-k -1
check "--tokens 0: exit 1" exits_with tokens 1 "--tokens expects an integer in \[1, " atlas sample "$CKPT" --prompt x --tokens 0
check "--seed -3: exit 1" exits_with seed 1 "--seed expects an integer >= 0, got '-3'" atlas sample "$CKPT" --prompt x --seed -3
check "--prompt and --prompt-file: exit 1" exits_with both 1 "give --prompt or --prompt-file, not both" \
  atlas sample "$CKPT" --prompt x --prompt-file "$T/prompt.txt"
check "a missing --prompt-file: exit 2 naming it" exits_with nofile 2 "$T/none.txt" atlas sample "$CKPT" --prompt-file "$T/none.txt"
check "no prompt on a byte model: exit 1 with the fix" exits_with empty 1 "a byte-tokenizer model has no start token" \
  atlas sample "$CKPT" --tokens 3
check "a prompt longer than the context: exit 1" exits_with long 1 "the prompt is 40 tokens, longer than the model's context \(model.seq_len = 32" \
  atlas sample "$CKPT" --prompt "$(printf 'x%.0s' {1..40})"
check "a deck key: exit 1" exits_with override 1 "atlas sample takes no key=value overrides" atlas sample "$CKPT" model.layers=3
check "an unknown --device: exit 1" exits_with device 1 "--device must be host or cuda, not 'tpu'" atlas sample "$CKPT" --prompt x --device tpu
atlas sample "$CKPT" --prompt x --tokens 2 --device cuda > "$T/cuda.out" 2>&1
rc=$?
if grep -q "built without CUDA" "$T/cuda.out"; then  # this binary has no CUDA backend (CI's)
  check "--device cuda without CUDA: exit 1 with the fix" test "$rc" == 1
  check "... the hint names make cuda" grep -q "hint: build it with \`make cuda\`, or run on the host (drop --device)" "$T/cuda.out"
fi
check "a --json into a missing directory: exit 2, before sampling" exits_with json 2 "--json $T/nodir/s.json: its directory $T/nodir does not exist" \
  atlas sample "$CKPT" --prompt x --json "$T/nodir/s.json"
check "a gpt2 model with a missing --tokenizer-dir: exit 2 naming the option" exits_with tokdir 2 "--tokenizer-dir" \
  atlas sample "$G2" --prompt x --tokenizer-dir "$T/no_gpt2"
launch_finish
