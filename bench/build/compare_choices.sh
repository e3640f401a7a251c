#!/bin/bash
# Compares two kiln binaries' engines for the zoo models, fp32 and fp16: per layer name, precision,
# tactic and workspace, and the memory plan, from warm builds on the same timing caches (made by
# KILN_A's cold build when missing), so that timing noise cannot make them differ.
# usage: bench/build/compare_choices.sh KILN_A KILN_B [WORKDIR]   (prints one line per model)
set -u
A=$1; B=$2; W=${3:-$(mktemp -d)}
mkdir -p "$W"
for m in bert_tiny efficientnet_tiny gpt_tiny mobilenetv3_tiny resnet_tiny squeezenet_tiny unet_tiny vit_tiny; do
  for p in fp32 fp16; do
    flag=""; [ $p = fp16 ] && flag=--fp16
    cache=$W/$m.$p.cache
    [ -f "$cache" ] || "$A" build zoo/$m/model.onnx -o $W/cold.kiln --timing-cache $cache $flag >/dev/null 2>&1
    for side in a b; do
      K=$A; [ $side = b ] && K=$B
      "$K" build zoo/$m/model.onnx -o $W/$side.kiln --timing-cache $cache $flag --report $W/$side.json \
        >/dev/null 2>&1 || echo "FAIL $side $m $p"
    done
    python3 - "$W" "$m $p" <<'PY'
import json, sys
w, what = sys.argv[1], sys.argv[2]
a, b = (json.load(open(f"{w}/{x}.json")) for x in ("a", "b"))
f = lambda r: [(l["name"], l["precision"], l["tactic"], l["workspace_bytes"]) for l in r["layer_reports"]]
same = f(a) == f(b) and a["memory"] == b["memory"]
print(what, "same" if same else "DIFFERENT", len(f(a)), "layers")
PY
  done
done
