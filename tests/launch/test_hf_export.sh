#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# `atlas export --format hf` and `atlas import --format hf` with the binary (docs/formats.md,
# "Hugging Face export"): a 2-stage run's checkpoint and a tp = 2 one are exported; an independent reader
# (tests/hf/check_export.py: python3 struct/json, h5dump for the checkpoint) checks every name,
# shape, dtype and value; transformers' GPT-2 forward pass written out in python
# (tests/hf/gpt2_reference.py) on the exported file gives atlas's logits; import then export is bitwise; a run fine-tunes from the imported
# checkpoint; bad input (a damaged safetensors header, a missing config.json, a non-GPT-2 config,
# a non-GPT-2 checkpoint, a deck of another shape) ends with exit code 2 and a message naming the
# file and the fix. Loopback only.
# usage: test_hf_export.sh SOURCE_DIR ATLAS_BIN
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
launch_setup test_hf_export.sh hf-test "$@"
PY=/usr/bin/python3
if ! command -v h5dump > /dev/null; then
  echo "SKIP: h5dump is missing (apt-get install hdf5-tools)"
  exit 77
fi
SMALL=(model.layers=2 model.hidden=64 model.heads=4)
COMMON=(inputs/default.deck "parallel.stages_per_dc=1 1" parallel.dp_size=1 "${SMALL[@]}"
        run.log_every_steps=1 train.eval_every_steps=0 run.out_dir="$T")
MPI=(mpirun -np 2 --mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
train() { timeout 120 "${MPI[@]}" "$ATLAS_BIN" train "${COMMON[@]}" "$@"; }
atlas() { timeout 60 "$ATLAS_BIN" "$@"; }
fails_with() { exits_with "$1" 2 "${@:2}"; }  # OUT_NAME REGEX COMMAND...: exit code 2 and the message

# A 2-stage run (pp = 2: each stage writes its own tensors), checkpoint at step 2.
train run.name=src run.steps=2 ckpt.every_steps=2 > "$T/src.out" 2>&1
CKPT=$T/src/ckpt/step-000002.h5
check "the source run wrote its checkpoint" test -f "$CKPT"

check "export exits 0" to "$T/export.out" atlas export "$CKPT" --format hf --out "$T/hf" --logits "$T/logits.safetensors"
check "export names what it wrote" grep -q "model.safetensors (28 tensors)" "$T/export.out"
check "independent reader: every name, shape, dtype and value" $PY tests/hf/check_export.py "$T/hf" "$CKPT"
check "GPT-2's forward pass on model.safetensors gives atlas's logits (1e-4)" \
  $PY tests/hf/gpt2_reference.py "$T/hf" "$T/logits.safetensors" 1e-4

# A tensor-parallel checkpoint (tp = 2: qkv, fc, proj stored as boxes of two writers) too.
timeout 120 "${MPI[@]}" "$ATLAS_BIN" train inputs/default.deck "parallel.stages_per_dc=1 0" "cluster.gpus_per_dc=2 0" \
  parallel.dp_size=1 parallel.tp_size=2 "${SMALL[@]}" run.steps=1 ckpt.every_steps=0 train.eval_every_steps=0 \
  run.out_dir="$T" run.name=tp > "$T/tp.out" 2>&1
check "tp 2: export" to "$T/export_tp.out" atlas export "$T/tp/ckpt/step-000001.h5" --format hf --out "$T/hf_tp" --logits "$T/logits_tp.safetensors"
check "tp 2: independent reader" $PY tests/hf/check_export.py "$T/hf_tp" "$T/tp/ckpt/step-000001.h5"
check "tp 2: GPT-2's forward pass gives atlas's logits" $PY tests/hf/gpt2_reference.py "$T/hf_tp" "$T/logits_tp.safetensors" 1e-4

# Variants of the exported directory (tests/hf/make_bad.py): damaged ones and the hub layout.
for kind in long_header overlap dtype truncated relu untied string_width extra huge_layers value_flood hub hub_untied hub_head_twice hub_bool_masks i64_weight bf16 bf16_ref f16 f16_ref; do
  $PY tests/hf/make_bad.py "$T/hf" "$T/bad_$kind" "$kind"
done

# Import, export again: bitwise the same files.
check "import exits 0" to "$T/import.out" atlas import --format hf "$T/hf" --out "$T/imported"
check "import wrote step 0" test -f "$T/imported/step-000000.h5"
check "import: /layout/stages_per_dc holds its one DC's stage (shape (dc_count,), as docs/formats.md says)" \
  bash -c "h5dump -a /layout/stages_per_dc '$T/imported/step-000000.h5' | grep -q 'DATASPACE  SIMPLE { ( 1 ) / ( 1 ) }'"
cp "$T/imported/step-000000.h5" "$T/imported_copy.h5"
check "import into a directory that holds its step 0 already: exit 2 with the fix" fails_with import_again \
  "atlas import: '$T/imported/step-000000.h5' already exists \(an earlier import, or a run's first checkpoint\)" \
  atlas import --format hf "$T/hf" --out "$T/imported"
check "... and the earlier file is untouched" cmp "$T/imported/step-000000.h5" "$T/imported_copy.h5"
check "export of the import" to "$T/export2.out" atlas export "$T/imported/step-000000.h5" --format hf --out "$T/hf2"
check "import then export: model.safetensors bitwise" cmp "$T/hf/model.safetensors" "$T/hf2/model.safetensors"
check "import then export: config.json bitwise" cmp "$T/hf/config.json" "$T/hf2/config.json"
# key=value overrides without --deck are checked as a deck's are: a model.* that disagrees with
# the weights is refused (it used to be stored in the checkpoint's deck unchecked), nothing written.
check "import: an override that disagrees with the weights" fails_with import_override \
  "has model.hidden = 64 \(n_embd\), the deck 128" atlas import --format hf "$T/hf" --out "$T/imported_bad" model.hidden=128
check "import: the refused import wrote nothing" test ! -e "$T/imported_bad/step-000000.h5"
check "import: a block the runtime does not build" fails_with import_swiglu \
  "model.mlp = swiglu describes a block the runtime does not build" atlas import --format hf "$T/hf" --out "$T/imported_swiglu" model.mlp=swiglu
check "import: the refused swiglu import wrote nothing" test ! -e "$T/imported_swiglu/step-000000.h5"
echo x > "$T/a_file"
check "export: an --out that is a file" fails_with export_out_file "atlas export: --out $T/a_file exists and is not a directory" \
  atlas export "$CKPT" --format hf --out "$T/a_file"
check "import: an --out that is a file" fails_with import_out_file "atlas import: --out $T/a_file exists and is not a directory" \
  atlas import --format hf "$T/hf" --out "$T/a_file"

# The published gpt2 files' layout (no prefix, mask buffers, lm_head = wte) imports to the same.
check "import of the hub layout" to "$T/import_hub.out" atlas import --format hf "$T/bad_hub" --out "$T/imported_hub"
check "export of it" to "$T/export_hub.out" atlas export "$T/imported_hub/step-000000.h5" --format hf --out "$T/hf_hub"
check "hub layout: the same model.safetensors" cmp "$T/hf/model.safetensors" "$T/hf_hub/model.safetensors"
# Mask buffers stored as BOOL (some transformers versions): skipped whatever their dtype.
check "import of the hub layout with BOOL masks" to "$T/import_hub_bool.out" atlas import --format hf "$T/bad_hub_bool_masks" --out "$T/imported_hub_bool"
check "export of it" to "$T/export_hub_bool.out" atlas export "$T/imported_hub_bool/step-000000.h5" --format hf --out "$T/hf_hub_bool"
check "BOOL masks: the same model.safetensors" cmp "$T/hf/model.safetensors" "$T/hf_hub_bool/model.safetensors"

# BF16 and F16 files import as their float32 values.
for d in bf16 f16; do
  check "$d: import" to "$T/import_$d.out" atlas import --format hf "$T/bad_$d" --out "$T/imported_$d"
  check "$d: its float32 twin" to "$T/import_${d}_ref.out" atlas import --format hf "$T/bad_${d}_ref" --out "$T/imported_${d}_ref"
  atlas export "$T/imported_$d/step-000000.h5" --format hf --out "$T/hf_$d" > /dev/null 2>&1
  atlas export "$T/imported_${d}_ref/step-000000.h5" --format hf --out "$T/hf_${d}_ref" > /dev/null 2>&1
  check "$d: the same model as its float32 twin" cmp "$T/hf_$d/model.safetensors" "$T/hf_${d}_ref/model.safetensors"
done

# Fine-tuning starts from the imported weights (step 0, fresh AdamW moments).
train run.name=tune run.steps=2 ckpt.every_steps=0 run.resume="$T/imported/step-000000.h5" > "$T/tune.out" 2>&1
check "a run fine-tunes from the imported checkpoint" grep -q "^# OK: 2 steps" "$T/tune.out"
check "it says where it started" grep -q "resumed from $T/imported/step-000000.h5 at step 0" "$T/tune.out"
LAYOUT=("parallel.stages_per_dc=1 1" parallel.dp_size=1)
check "import --deck of the same shape" atlas import --format hf "$T/hf" --out "$T/imported_deck" \
  --deck inputs/default.deck "${LAYOUT[@]}" "${SMALL[@]}"
check "import --deck of another shape: exit 2 naming the key" fails_with deck_shape \
  "'$T/hf/config.json' has model.layers = 2 \\(n_layer\\), the deck 4" \
  atlas import --format hf "$T/hf" --out "$T/x" --deck inputs/default.deck "${LAYOUT[@]}" model.layers=4 model.hidden=64 model.heads=4

# Bad input, each with the file and the fix.
mkdir -p "$T/nocfg" && cp "$T/hf/model.safetensors" "$T/nocfg/"
check "missing config.json" fails_with nocfg "'$T/nocfg/config.json' does not exist" \
  atlas import --format hf "$T/nocfg" --out "$T/x"
check "its hint" grep -q "hint: save the model with transformers' save_pretrained(DIR)" "$T/nocfg.out"
mkdir -p "$T/nost" && cp "$T/hf/config.json" "$T/nost/"
check "missing model.safetensors" fails_with nost "safetensors file '$T/nost/model.safetensors' does not exist" \
  atlas import --format hf "$T/nost" --out "$T/x"
ST="safetensors file '$T/bad_%s/model.safetensors'"
check "header length past the end" fails_with long_header "$(printf "$ST" long_header): header length [0-9]+ runs past the end of the file.*" \
  atlas import --format hf "$T/bad_long_header" --out "$T/x"
check "overlapping offsets" fails_with overlap "$(printf "$ST" overlap): tensor '.*' \(bytes \[[0-9]+, [0-9]+\)\) overlaps the tensor before it" \
  atlas import --format hf "$T/bad_overlap" --out "$T/x"
check "unknown dtype" fails_with dtype "$(printf "$ST" dtype): tensor '.*': unknown dtype 'F33'" \
  atlas import --format hf "$T/bad_dtype" --out "$T/x"
check "truncated data" fails_with truncated "$(printf "$ST" truncated): the file is truncated: the tensors need [0-9]+ bytes of data, the file holds [0-9]+" \
  atlas import --format hf "$T/bad_truncated" --out "$T/x"
check "the hint says how to fix a damaged file" grep -q "hint: the file is damaged or was not written as safetensors" "$T/truncated.out"
check "activation relu" fails_with relu "'$T/bad_relu/config.json': activation_function is \"relu\"; atlas computes GELU's tanh approximation" \
  atlas import --format hf "$T/bad_relu" --out "$T/x"
check "a width written as a string" fails_with string_width "'$T/bad_string_width/config.json': \"n_embd\" is the string \"64\", not a positive integer" \
  atlas import --format hf "$T/bad_string_width" --out "$T/x"
check "n_layer beyond model.layers' limit, with --deck too" fails_with huge_layers \
  "'$T/bad_huge_layers/config.json': n_layer = \"2000000000\": expected an integer in \\[1, 4096\\] \\(atlas's model.layers\\)" \
  atlas import --format hf "$T/bad_huge_layers" --out "$T/x" --deck inputs/default.deck "${LAYOUT[@]}" model.layers=4 model.hidden=64 model.heads=4
check "a header of far more JSON values than its length holds" fails_with value_flood \
  "$(printf "$ST" value_flood): the header is not valid JSON: more values than a header of [0-9]+ bytes holds" \
  atlas import --format hf "$T/bad_value_flood" --out "$T/x"
check "untied head" fails_with untied "'$T/bad_untied/config.json': tie_word_embeddings is false" \
  atlas import --format hf "$T/bad_untied" --out "$T/x"
check "a tensor GPT-2 does not have" fails_with extra "tensor 'transformer.h.0.attn.q_norm.weight' is not part of a GPT-2 model" \
  atlas import --format hf "$T/bad_extra" --out "$T/x"
check "lm_head.weight that differs from wte" fails_with hub_untied \
  "'$T/bad_hub_untied/model.safetensors': lm_head.weight differs from wte.weight" atlas import --format hf "$T/bad_hub_untied" --out "$T/x"
check "a weight stored as I64" fails_with i64_weight \
  "'$T/bad_i64_weight/model.safetensors': tensor 'transformer.wpe.weight' is stored as I64; atlas reads F32, F16 and BF16" \
  atlas import --format hf "$T/bad_i64_weight" --out "$T/x"
check "lm_head.weight twice" fails_with hub_head_twice \
  "'$T/bad_hub_head_twice/model.safetensors' holds 'lm_head.weight' twice \\(with and without the \"transformer.\" prefix\)" \
  atlas import --format hf "$T/bad_hub_head_twice" --out "$T/x"
# An export interrupted between its two renames leaves its marker: import refuses the directory.
cp -r "$T/hf" "$T/interrupted" && touch "$T/interrupted/.atlas-export-incomplete"
check "an interrupted export's directory" fails_with interrupted \
  "'$T/interrupted' holds .atlas-export-incomplete: an atlas export into it was interrupted" \
  atlas import --format hf "$T/interrupted" --out "$T/x"
check "a finished export leaves no marker" test ! -e "$T/hf/.atlas-export-incomplete"
# An export that fails while writing its files (model.safetensors.tmp cannot be created) leaves
# the earlier export in the directory whole, without the marker: it still imports.
cp -r "$T/hf" "$T/failed" && mkdir "$T/failed/model.safetensors.tmp"
atlas export "$CKPT" --format hf --out "$T/failed" > "$T/failed_export.out" 2>&1
check "an export that cannot write fails" test $? -ne 0
check "... without leaving the marker" test ! -e "$T/failed/.atlas-export-incomplete"
check "... and the earlier export still imports" to "$T/failed_import.out" atlas import --format hf "$T/failed" --out "$T/failed_imported"
check "nothing was written by the failed imports" test ! -e "$T/x/step-000000.h5"

# A checkpoint of something else (atlas bench ckpt's synthetic tensors) is not exported.
atlas bench ckpt --dir "$T/bench" --keep --size 1M --repeat 1 --tensors 4 > "$T/bench.out" 2>&1
BENCH=$(ls "$T"/bench/step-*.h5 2>/dev/null | head -n 1)
check "atlas bench ckpt left a checkpoint" test -n "$BENCH"
check "a non-GPT-2 checkpoint: exit 2, named, with the fix" fails_with notgpt2 \
  "checkpoint '$BENCH' is not a GPT-2-shaped model: " atlas export "$BENCH" --format hf --out "$T/y"
check "its hint" grep -q "hint: atlas export --format hf writes GPT-2 models only" "$T/notgpt2.out"
# A config.json value outside atlas's limits is config.json's, not the command line's.
mkdir -p "$T/big" && cp "$T/hf/model.safetensors" "$T/big/" &&
  sed 's/"n_layer": *[0-9]*/"n_layer": 1000000000/' "$T/hf/config.json" > "$T/big/config.json"
check "n_layer past atlas's limit: exit 2 naming config.json's key" fails_with big \
  "'$T/big/config.json': n_layer = \"1000000000\": expected an integer in \\[1, 4096\\] \\(atlas's model.layers\\)" \
  atlas import --format hf "$T/big" --out "$T/x"
# --logits is checked before anything is written (a directory there failed after the export).
check "export --logits naming the --out directory: exit 2" fails_with logits_out \
  "atlas export: --logits $T/lo is the --out directory" atlas export "$CKPT" --format hf --out "$T/lo" --logits "$T/lo"
check "and nothing written" test ! -e "$T/lo"
check "export --logits into a missing directory: exit 2" fails_with logits_dir \
  "--logits $T/nodir/l.safetensors: its directory $T/nodir does not exist" \
  atlas export "$CKPT" --format hf --out "$T/lo2" --logits "$T/nodir/l.safetensors"
check "and nothing written" test ! -e "$T/lo2"
check "usage: --format is required" bash -c "'$ATLAS_BIN' export '$CKPT' --out '$T/z' 2>&1 | grep -q -- '--format hf is required'"

launch_finish
