#!/usr/bin/env bash
# Builds the `fuzz` preset and runs every libFuzzer target (fuzz/<name>_fuzz.cc -> <name>_fuzz)
# for N seconds each (default 60). Exit status is non-zero when a target finds a crash, leak or
# timeout; the reproducer is left in build-fuzz/fuzz-artifacts/.
#   scripts/fuzz.sh [SECONDS] [TARGET...]
# Seeds per target: files in fuzz/seeds/<target>/, whatever an executable fuzz/seed_<target>.sh
# writes into the directory it is given, and small zoo models for the onnx_* targets.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

seconds="${1:-60}"
shift || true
build=build-fuzz
if [ $# -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(for f in fuzz/*_fuzz.cc; do [ -f "$f" ] && basename "$f" .cc; done)
fi
if [ ${#targets[@]} -eq 0 ]; then
  echo "fuzz.sh: no fuzz targets in fuzz/CMakeLists.txt" >&2
  exit 1
fi

cmake --preset fuzz >/dev/null
nice cmake --build "$build" -j"${KILN_JOBS:-2}" --target "${targets[@]}"

# Seeds per target: committed ones in fuzz/seeds/<target>/ (if any), and for the ONNX loaders
# the zoo models below 600 KB (large seeds make every execution slow).
seed_dir() {
  local target="$1" dir="$build/fuzz-seeds/$1"
  rm -rf "$dir"
  mkdir -p "$dir"
  if [ -d "fuzz/seeds/$target" ]; then cp "fuzz/seeds/$target"/* "$dir"/ 2>/dev/null || true; fi
  if [ -x "fuzz/seed_$target.sh" ]; then "fuzz/seed_$target.sh" "$dir" >&2; fi
  case "$target" in
    onnx_*)
      for m in zoo/*/model.onnx; do
        [ -f "$m" ] || continue
        if [ "$(stat -c %s "$m")" -lt 600000 ]; then
          cp "$m" "$dir/$(basename "$(dirname "$m")").onnx"
        fi
      done
      # ONNX's own single-op test models (tiny, every opset), when scripts/python_env.sh has
      # made .venv: the ops whose older versions the importer rewrites, and those it expands.
      local node_tests="${KILN_ONNX_NODE_TESTS:-$(ls -d .venv/lib/python3*/site-packages/onnx/backend/test/data/node 2>/dev/null | head -1)}"
      if [ -n "$node_tests" ] && [ -d "$node_tests" ]; then
        for m in "$node_tests"/test_{slice,pad,clip,resize,upsample,softmax,logsoftmax,hardmax,split,squeeze,unsqueeze,reduce_sum,reduce_mean,dropout,batchnorm,constant,cast,topk,scatter,identity,relu,add,attention_4d_gqa,attention_3d_with_past,attention_4d_diff_heads_mask4d,rotary_embedding}*/model.onnx; do
          [ -f "$m" ] && cp "$m" "$dir/$(basename "$(dirname "$m")").onnx"
        done
      fi
      ;;
  esac
  echo "$dir"
}

status=0
for t in "${targets[@]}"; do
  seeds="$(seed_dir "$t")"
  corpus="$build/fuzz-corpus/$t"  # grows across runs on the same machine
  artifacts="$build/fuzz-artifacts"
  mkdir -p "$corpus" "$artifacts"
  echo "fuzz.sh: $t for ${seconds}s ($(ls "$seeds" | wc -l) seeds)"
  if ! ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}" \
      "$build/fuzz/$t" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2560 \
      -max_len=1048576 -print_final_stats=1 -artifact_prefix="$artifacts/$t-" \
      "$corpus" "$seeds" 2>"$build/fuzz-$t.log"; then
    echo "fuzz.sh: $t FAILED; log: $build/fuzz-$t.log, reproducer in $artifacts/" >&2
    tail -40 "$build/fuzz-$t.log" >&2
    status=1
  else
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$build/fuzz-$t.log" || true
    echo "fuzz.sh: $t OK"
  fi
done
exit $status
