#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# atlas tokenize and data.format = shards end to end with the binary (#26): tokenize a few Brown
# files (byte tokenizer) into several train/val shards, with a progress line and a summary; an
# independent reader (python3, llm.c's header rules) finds the train then val tokens equal to the
# files' bytes; `atlas train` on the shards writes bitwise the metrics (step, loss, val_loss, lr,
# grad_norm) of `atlas train` on the text; shards written by another program (python3) train; a
# token outside model.vocab and a glob that matches nothing end the job with exit code 2 and a
# message naming the file and the fix. Loopback only; removes its temp dir.
# usage: test_tokenize.sh SOURCE_DIR ATLAS_BIN
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
launch_setup test_tokenize.sh tokenize "$@"

mkdir -p "$T/text"
for f in ca01 ca02 cb01 cc01; do cp "data/brown/$f.txt" "$T/text/"; done

# ---- atlas tokenize ----
"$ATLAS_BIN" tokenize "$T/text" --out "$T/shards" --val-fraction 0.1 --shard-tokens 20000 \
  > "$T/tokenize.out" 2>&1
rc=$?
check "atlas tokenize exits 0 (got $rc)" test "$rc" -eq 0
check "it prints a progress line with tokens/s" grep -q "^tokenize: .* tokens, .* tokens/s" "$T/tokenize.out"
check "and a summary" grep -q "^tokenized 4 file(s), .* tokens in .* s (.* tokens/s" "$T/tokenize.out"
check "several train shards" test -e "$T/shards/train_000002.bin"
check "a val shard" test -e "$T/shards/val_000000.bin"
check "an independent reader finds the text's bytes, train then val" python3 - "$T" <<'EOF'
import glob, struct, sys
t = sys.argv[1]
text = b"".join(open(f, "rb").read() for f in sorted(glob.glob(t + "/text/*.txt")))
def read(pattern):
    out = b""
    for f in sorted(glob.glob(pattern)):
        data = open(f, "rb").read()
        magic, version, count = struct.unpack("<3i", data[:12])
        assert magic == 20240520 and version == 1, f
        assert len(data) == 1024 + 2 * count, f
        out += bytes(struct.unpack("<%dH" % count, data[1024:]))
    return out
train, val = read(t + "/shards/train_*.bin"), read(t + "/shards/val_*.bin")
assert len(val) == int(0.1 * len(text)), (len(val), len(text))
assert train + val == text
EOF

# ---- training from the shards == training on the text ----
COMMON=(inputs/default.deck "parallel.stages_per_dc=1 1" parallel.dp_size=1 run.log_every_steps=1
        run.steps=3 train.eval_every_steps=1 ckpt.every_steps=0 model.hidden=32 model.seq_len=32
        data.val_fraction=0.1 run.out_dir="$T")
SHARDS=(data.format=shards "data.train_shards=$T/shards/train_*.bin" "data.val_shards=$T/shards/val_*.bin")
MPI=(mpirun -np 2 --mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
train() { # NAME [KEY=VALUE...]
  timeout 120 "${MPI[@]}" "$ATLAS_BIN" train "${COMMON[@]}" run.name="$1" "${@:2}"
}
train ontext "data.corpus_dir=$T/text" > "$T/text.out" 2>&1
check "training on the text runs" grep -q "^# OK: 3 steps" "$T/text.out"
train onshards "${SHARDS[@]}" > "$T/shards.out" 2>&1
check "training on the shards runs" grep -q "^# OK: 3 steps" "$T/shards.out"
check "with bitwise the text's step, loss, val_loss, lr and grad_norm" \
  cmp <(cut -d, -f1-5 "$T/ontext/metrics.csv") <(cut -d, -f1-5 "$T/onshards/metrics.csv")
check "(three steps of them)" test "$(awk 'NR > 1' "$T/onshards/metrics.csv" | wc -l)" -eq 3

# ---- shards written by another program ----
mkdir -p "$T/other"
python3 - "$T/other" <<'EOF'
import random, struct, sys
random.seed(5)
for name, n, top in (("train_a.bin", 30000, 256), ("val_a.bin", 5000, 256), ("bad.bin", 5000, 300)):
    toks = [random.randrange(256) for _ in range(n)]
    if top > 256:
        toks[1234] = 299
    with open(sys.argv[1] + "/" + name, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack("<%dH" % n, *toks))
EOF
train other data.format=shards "data.train_shards=$T/other/train_*.bin" \
  "data.val_shards=$T/other/val_*.bin" > "$T/other.out" 2>&1
check "shards written by python3 train" grep -q "^# OK: 3 steps" "$T/other.out"

train bad data.format=shards "data.train_shards=$T/other/bad.bin" \
  "data.val_shards=$T/other/val_*.bin" > "$T/bad.out" 2>&1
rc=$?
check "a token outside model.vocab: exit code 2 (got $rc)" test "$rc" -eq 2
check "naming the shard, the offset and the token" grep -q \
  "ERROR: .*shard '$T/other/bad.bin' (data.train_shards) holds token 299 at token offset 1234" "$T/bad.out"
train none data.format=shards "data.train_shards=$T/other/nothing_*.bin" \
  "data.val_shards=$T/other/val_*.bin" > "$T/none.out" 2>&1
rc=$?
check "a glob that matches nothing: exit code 2 (got $rc)" test "$rc" -eq 2
check "naming the pattern and the fix" grep -q \
  "ERROR: .*data.train_shards = '$T/other/nothing_\*.bin' matches no file" "$T/none.out"
check "before the run started: no run directory, no WAN transport" \
  bash -c "test ! -e '$T/none' && ! grep -q 'pre-flight' '$T/none.out'"
check "a deck with data.format = shards and no shards is refused" \
  bash -c "'$ATLAS_BIN' schedule inputs/default.deck data.format=shards 2>&1 | grep -q 'data.format = shards needs data.train_shards'"
# Deck keys are not tokenize's (its settings are options); a file whose name holds '=' is an input;
# a missing GPT-2 vocabulary names the option, not the deck key.
"$ATLAS_BIN" tokenize "$T/text" --out "$T/keys" data.val_fraction=0.2 > "$T/keys.out" 2>&1
rc=$?
check "tokenize with a deck key: exit code 1 (got $rc)" test "$rc" -eq 1
check "naming the word and the options" grep -q \
  "ERROR: atlas tokenize takes no deck keys ('data.val_fraction=0.2' is neither .*--val-fraction" "$T/keys.out"
check "and writing nothing" test ! -e "$T/keys"
mkdir -p "$T/eq" && cp data/brown/ca01.txt "$T/eq/a=b.txt"
"$ATLAS_BIN" tokenize "$T/eq/a=b.txt" --out "$T/eqshards" > "$T/eq.out" 2>&1
rc=$?
check "a file named a=b.txt tokenizes (got $rc)" test "$rc" -eq 0
check "as one file" grep -q "^tokenized 1 file(s)" "$T/eq.out"
"$ATLAS_BIN" tokenize "$T/text" --out "$T/nobpe" --tokenizer gpt2 --tokenizer-dir "$T/nowhere" > "$T/nobpe.out" 2>&1
rc=$?
check "gpt2 without its files: exit code 2 (got $rc)" test "$rc" -eq 2
check "the hint names --tokenizer-dir" grep -q "point --tokenizer-dir at a directory" "$T/nobpe.out"
# --out that cannot be made fails before the tokenizing; a job that fails before writing shards
# leaves no directory it created.
: > "$T/afile"
"$ATLAS_BIN" tokenize "$T/text" --out "$T/afile/sub" > "$T/outfile.out" 2>&1
rc=$?
check "--out under a plain file: exit code 2 (got $rc)" test "$rc" -eq 2
check "named before any tokenizing" bash -c "grep -q 'ERROR: atlas tokenize: cannot create --out $T/afile/sub' '$T/outfile.out' && ! grep -q '^tokenize:' '$T/outfile.out'"
: > "$T/empty.txt"
# One file named twice (another spelling, a link): refused, nothing written.
cp data/brown/ca01.txt "$T/once.txt" && ln -s "$T/once.txt" "$T/link.txt"
for second in "$T/./once.txt" "$T/link.txt"; do
  "$ATLAS_BIN" tokenize "$T/once.txt" "$second" --out "$T/twice" > "$T/twice.out" 2>&1
  rc=$?
  check "a file given twice ($second): exit code 2 (got $rc)" test "$rc" -eq 2
  check "... named, with the fix" grep -q "atlas tokenize: '$second' is '$T/once.txt' again (the same file by another path): its text would be tokenized twice" "$T/twice.out"
  check "... nothing written" test ! -e "$T/twice"
done
"$ATLAS_BIN" tokenize "$T/empty.txt" --out "$T/new/a/b" > "$T/empty.out" 2>&1
check "an empty input leaves no --out directory behind" test ! -e "$T/new"
launch_finish
