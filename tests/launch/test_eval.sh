#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `atlas eval` with the binary (README, "Evaluating a checkpoint"): on its own data and by
# default the run's own validation batches, it gives the validation loss the run logged at that
# step (a dp = 2 and a 2-stage run: to the last printed digit; tp = 2: to rounding); on the same text as token shards (atlas
# tokenize) the same loss; a random GPT-2-vocabulary model imported from a Hugging Face directory
# scores ln(50257) on Brown through the gpt2 tokenizer; every bad input ends with its exit code
# and a message with the fix. Loopback only.
# usage: test_eval.sh SOURCE_DIR ATLAS_BIN
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
launch_setup test_eval.sh eval-test "$@"
PY=/usr/bin/python3
MPI=(mpirun -np 2 --mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
atlas() { timeout 120 "$ATLAS_BIN" "$@"; }
SMALL=(model.layers=2 model.hidden=64 model.heads=4 model.seq_len=32 run.steps=10 ckpt.every_steps=10
       train.eval_every_steps=10 train.eval_batches=3 run.log_every_steps=5 run.out_dir="$T")
logged_val() { awk -F, '$1 == 9 {print $3}' "$T/$1/metrics.csv"; }     # RUN: val_loss of step 10
eval_loss() { sed -n 's/^loss \([0-9.]*\) nats\/token.*/\1/p' "$T/$1.out"; }  # OUT_NAME: atlas eval's loss

# A dp = 2 run (its validation loss is the mean over both replicas' batches) and a 2-stage run.
timeout 180 "${MPI[@]}" "$ATLAS_BIN" train inputs/default.deck "parallel.stages_per_dc=1 0" "cluster.gpus_per_dc=2 0" \
  parallel.dp_size=2 "${SMALL[@]}" run.name=dp2 > "$T/dp2_train.out" 2>&1
timeout 180 "${MPI[@]}" "$ATLAS_BIN" train inputs/default.deck "parallel.stages_per_dc=1 1" parallel.dp_size=1 \
  "${SMALL[@]}" run.name=pp2 > "$T/pp2_train.out" 2>&1
timeout 180 "${MPI[@]}" "$ATLAS_BIN" train inputs/default.deck "parallel.stages_per_dc=1 0" "cluster.gpus_per_dc=2 0" \
  parallel.dp_size=1 parallel.tp_size=2 "${SMALL[@]}" run.name=tp2 > "$T/tp2_train.out" 2>&1
DP2=$T/dp2/ckpt/step-000010.h5
TP2=$T/tp2/ckpt/step-000010.h5
PP2=$T/pp2/ckpt/step-000010.h5
check "the runs wrote their checkpoints" test -f "$DP2" -a -f "$PP2" -a -f "$TP2"
check "the runs logged a validation loss at step 10" test -n "$(logged_val dp2)" -a -n "$(logged_val pp2)" -a -n "$(logged_val tp2)"

# The run's footer names what to do next, with this binary and the newest checkpoint.
check "the footer's next line" grep -q "^# next: .*atlas report $T/pp2 | .*atlas eval $PP2 | .*atlas sample $PP2 --prompt \"The \"$" "$T/pp2_train.out"
NEXT_EVAL=$(sed -n 's/^# next: .* | \(.*atlas eval [^|]*\) | .*/\1/p' "$T/pp2_train.out")
check "... its eval command runs as printed" to "$T/next_eval.out" bash -c "$NEXT_EVAL"
check "... giving the run's loss" grep -q "^loss $(logged_val pp2) nats/token" "$T/next_eval.out"
check "dp 2: exit 0" to "$T/dp2.out" atlas eval "$DP2" --json "$T/dp2.json"
check "dp 2: the run's own batches, said" grep -q "6 batches of 4 x 32 tokens (train.eval_batches 3 x 2 DP replica(s): the run's own validation batches)" "$T/dp2.out"
same() { $PY -c 'import sys; sys.exit(abs(float(sys.argv[1]) - float(sys.argv[2])) > float(sys.argv[3]))' "$@"; }
check "dp 2: the loss the run logged at step 10 ($(logged_val dp2))" same "$(eval_loss dp2)" "$(logged_val dp2)" 1.5e-6
check "dp 2: --json holds it" $PY -c 'import json,sys; j=json.load(open(sys.argv[1])); sys.exit(not (abs(j["loss"] - float(sys.argv[2])) < 1e-6 and j["tokens"] == 6 * 4 * 32 and j["batches"] == 6))' "$T/dp2.json" "$(logged_val dp2)"
check "pp 2: exit 0" to "$T/pp2.out" atlas eval "$PP2"
check "pp 2: the loss the run logged at step 10 ($(logged_val pp2))" same "$(eval_loss pp2)" "$(logged_val pp2)" 1.5e-6
# tp 2 sums its row-parallel products in another order: the same loss to rounding.
check "tp 2: exit 0" to "$T/tp2.out" atlas eval "$TP2"
check "tp 2: the loss the run logged at step 10 ($(logged_val tp2)), to rounding" same "$(eval_loss tp2)" "$(logged_val tp2)" 2e-5
check "--batches 2: two batches" to "$T/b2.out" atlas eval "$PP2" --batches 2
check "... said so, claiming no run's batches" grep -q "; 2 batches of 4 x 32 tokens$" "$T/b2.out"
check "--batches 1: one batch" to "$T/b1.out" atlas eval "$PP2" --batches 1
check "... said in the singular" grep -q "; 1 batch of 4 x 32 tokens$" "$T/b1.out"
check "... another loss" test "$(eval_loss b2)" != "$(eval_loss pp2)"

# The same validation text as token shards: the same loss.
check "atlas tokenize the corpus" to "$T/tok.out" atlas tokenize data/brown --out "$T/shards" --val-fraction 0.05
check "shards: exit 0 (no data.train_shards needed)" to "$T/shards.out" atlas eval "$PP2" data.format=shards \
  "data.val_shards=$T/shards/val_*.bin"
check "shards: the text's loss" test "$(eval_loss shards)" == "$(eval_loss pp2)"
check "shards: the header claims no run's batches (data overridden)" bash -c "! grep -q \"the run's own\" '$T/shards.out'"
check "shards: named in the header" grep -q "# validation split: shards $T/shards/val_\*.bin (byte tokenizer)" "$T/shards.out"

# A GPT-2-vocabulary model with random weights (tests/hf/make_gpt2.py), imported: its logits are
# near 0, so its loss on Brown through the gpt2 tokenizer is near ln(50257) = 10.825.
$PY tests/hf/make_gpt2.py "$T/g2" random
check "import of the gpt2-vocabulary model" to "$T/g2import.out" atlas import --format hf "$T/g2" --out "$T/g2ck"
check "gpt2: exit 0" to "$T/g2.out" atlas eval "$T/g2ck/step-000000.h5" train.eval_batches=4 --json "$T/g2.json"
check "gpt2: the gpt2 tokenizer" grep -q "(gpt2 tokenizer); 4 batches" "$T/g2.out"
check "gpt2: loss within 0.05 of ln(50257)" $PY -c 'import json,math,sys; sys.exit(abs(json.load(open(sys.argv[1]))["loss"] - math.log(50257)) > 0.05)' "$T/g2.json"
check "an imported checkpoint does not claim a run's batches" bash -c "! grep -q \"the run's own\" '$T/g2.out'"

# A checkpoint with a NaN (tests/hf/make_gpt2.py nan, imported): exit 7 naming the batch.
$PY tests/hf/make_gpt2.py "$T/gnan" nan
check "import of the NaN model" to "$T/gnimport.out" atlas import --format hf "$T/gnan" --out "$T/gnck"
check "a non-finite loss: exit 7 with the fix" exits_with nan 7 \
  "'$T/gnck/step-000000.h5' \(step 0\): the loss of validation batch 0 is nan \(not finite\)" \
  atlas eval "$T/gnck/step-000000.h5" train.eval_batches=2

# Bad input.
check "under mpirun -np 2: exit 1" exits_with np2 1 "atlas eval runs as one process \(started with 2\); run it without mpirun" \
  timeout 60 "${MPI[@]}" "$ATLAS_BIN" eval "$PP2"
check "a model key: exit 1 with the fix" exits_with model_key 1 "atlas eval takes data.\* keys, train.eval_batches and train.micro_batch_size, not 'model.layers=3'" \
  atlas eval "$PP2" model.layers=3
check "an unknown data key: exit 2 naming it" exits_with unknown_key 2 "data.corpus_dri" atlas eval "$PP2" data.corpus_dri=x
check "a missing corpus: exit 2 naming it" exits_with no_corpus 2 "$T/no_corpus" atlas eval "$PP2" "data.corpus_dir=$T/no_corpus"
check "gpt2 data for a byte model: exit 2 with the fix" exits_with vocab 2 "the checkpoint's model.vocab = 256 cannot read data.tokenizer = gpt2's ids" \
  atlas eval "$PP2" data.tokenizer=gpt2
check "data.val_shards with text data: exit 2 with the fix" exits_with val_text 2 "atlas eval: data.val_shards is set but data.format = text reads data.corpus_dir" \
  atlas eval "$PP2" "data.val_shards=$T/shards/val_*.bin"
check "shards without data.val_shards: exit 2" exits_with no_val 2 "atlas eval: data.format = shards needs data.val_shards" \
  atlas eval "$PP2" data.format=shards
check "a missing corpus: the note on where data.* comes from" grep -q "note: atlas eval '$PP2' reads data.\* from the checkpoint's deck" "$T/no_corpus.out"
mkdir -p "$T/tiny" && printf 'short text' > "$T/tiny/a.txt"
check "a validation split shorter than one sample: exit 2, seq_len named as the checkpoint's" exits_with short 2 \
  "hint: \(model.seq_len is the checkpoint's\) raise data.val_fraction" atlas eval "$PP2" "data.corpus_dir=$T/tiny"
check "more batches than the split holds: a warning with the fix" to "$T/many.out" atlas eval "$PP2" data.val_fraction=0.001 --batches 60
check "... said" grep -q "windows count more than once in the loss" "$T/many.out"
check "--batches 0: exit 1" exits_with batches 1 "--batches expects an integer in \[1, " atlas eval "$PP2" --batches 0
check "a checkpoint directory: exit 2 naming its newest checkpoint" exits_with ckpt_dir 2 \
  "checkpoint '$T/pp2/ckpt' is a directory, not a checkpoint file.*" atlas eval "$T/pp2/ckpt"
check "... the hint" grep -q "hint: its newest checkpoint is $PP2" "$T/ckpt_dir.out"
check "a validation list naming one shard twice: exit 2" exits_with val_twice 2 "data.val_shards names '$T/shards/val_000000.bin' twice" \
  atlas eval "$PP2" data.format=shards "data.val_shards=$T/shards/val_000000.bin $T/shards/val_000000.bin"
check "atlas tokenize --tokenizer gpt2" to "$T/tok2.out" atlas tokenize data/brown/ca01.txt --out "$T/shards_gpt2" --tokenizer gpt2
check "gpt2 shards for a byte model: exit 2 with a fix eval can take" exits_with gpt2_shards 2 \
  "hint: the shard was written by a tokenizer with a larger vocabulary than this checkpoint's 256 ids: evaluate it on shards written with \`atlas tokenize --tokenizer byte\`" \
  atlas eval "$PP2" data.format=shards "data.val_shards=$T/shards_gpt2/val_*.bin"
check "a missing checkpoint: exit 2 naming it" exits_with missing 2 "$T/nope.h5" atlas eval "$T/nope.h5"
check "a --json into a missing directory: exit 2" exits_with json 2 "--json $T/nodir/e.json: its directory $T/nodir does not exist" \
  atlas eval "$PP2" --json "$T/nodir/e.json"
atlas eval "$PP2" --device cuda > "$T/cuda.out" 2>&1
rc=$?
if grep -q "built without CUDA" "$T/cuda.out"; then  # this binary has no CUDA backend (CI's)
  check "--device cuda without CUDA: exit 1 with the fix" test "$rc" == 1
  check "... the hint names make cuda" grep -q "hint: build it with \`make cuda\`, or run on the host (drop --device)" "$T/cuda.out"
fi
check "an unknown --device: exit 1" exits_with device 1 "--device must be host or cuda, not 'tpu'" atlas eval "$PP2" --device tpu
launch_finish
