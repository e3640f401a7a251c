#!/usr/bin/env python3
"""Checks kiln's include graph against the layer table in docs/architecture.md.

Every `#include "kiln/..."` in src/kiln is an edge from the including file's layer to the
included header's layer. An edge the table does not allow fails the check (exit 1), naming the
file, the line and the rule to change. `--matrix` prints the layer matrix: rows include columns,
each cell the number of #include lines.

With `--targets BUILD/kiln_targets.json` (written by CMake, cmake/KilnTargets.cmake) it also
checks that every library's sources include only headers of targets it links, directly or
through their links, so a layer sees only what it links even though src/ is one include
directory.

Layers are src/kiln's folders, except that backends/cpu and backends/cuda are layers of their
own apart from the backend interface (backends/*.h).
"""

import argparse
import collections
import json
import os
import re
import sys

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"kiln/([^"]+)"', re.MULTILINE)
SOURCE_EXTS = (".h", ".cc", ".cu", ".cuh", ".inc")
SUB_LAYERS = ("backends/cpu", "backends/cuda")


def layer_of(rel):
    """The layer of a path relative to src/kiln ("backends/cpu/conv.cc" -> "backends/cpu")."""
    for sub in SUB_LAYERS:
        if rel.startswith(sub + "/"):
            return sub
    return rel.split("/", 1)[0]


def parse_table(doc_path):
    """Reads `## Layers` of docs/architecture.md: the order of layers and what each may include.

    The table has a header row starting `| Layer | May include |`; each row names a layer in
    backticks and the layers it may include (backticked, any separators). A layer may always
    include itself.
    """
    with open(doc_path, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"^## Layers\s*$(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    if not m:
        sys.exit(f"{doc_path}: no '## Layers' section")
    section = m.group(1)
    order, allowed = [], {}
    in_table = False
    for line in section.splitlines():
        line = line.strip()
        if re.match(r"^\|\s*Layer\s*\|\s*May include\s*\|", line):
            in_table = True
            continue
        if not in_table:
            continue
        if not line.startswith("|"):
            if order:
                break
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) < 2 or set(cells[0]) <= set("-: "):
            continue
        names = re.findall(r"`([^`]+)`", cells[0])
        if len(names) != 1:
            sys.exit(f"{doc_path}: layer row without one `layer` name: {line}")
        layer = names[0]
        order.append(layer)
        allowed[layer] = set(re.findall(r"`([^`]+)`", cells[1])) | {layer}
    if not order:
        sys.exit(f"{doc_path}: '## Layers' has no '| Layer | May include |' table")
    for layer, targets in allowed.items():
        unknown = targets - set(order)
        if unknown:
            sys.exit(f"{doc_path}: layer `{layer}` may include unknown layer(s) {sorted(unknown)}")
    return order, allowed


def scan_includes(src_kiln):
    """Yields (file relative to src/kiln, line number, included path relative to src/kiln)."""
    for root, dirs, files in os.walk(src_kiln):
        dirs.sort()
        for name in sorted(files):
            if not name.endswith(SOURCE_EXTS):
                continue
            path = os.path.join(root, name)
            rel = os.path.relpath(path, src_kiln)
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            for m in INCLUDE_RE.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                yield rel, line, m.group(1)


def check_layers(edges, order, allowed):
    errors = []
    for rel, line, inc in edges:
        src, dst = layer_of(rel), layer_of(inc)
        if src not in allowed:
            errors.append(f"src/kiln/{rel}: layer `{src}` is not in the layer table")
        elif dst not in allowed:
            errors.append(f"src/kiln/{rel}:{line}: includes kiln/{inc} of layer `{dst}`, "
                          "which is not in the layer table")
        elif dst not in allowed[src]:
            errors.append(f"src/kiln/{rel}:{line}: `{src}` includes kiln/{inc} (`{dst}`); "
                          f"the layer table lets `{src}` include only "
                          f"{', '.join(l for l in order if l in allowed[src])}")
    return errors


def print_matrix(edges, order, allowed, out):
    counts = collections.Counter((layer_of(r), layer_of(i)) for r, _, i in edges)
    layers = list(order) + sorted({l for pair in counts for l in pair} - set(order))
    short = {l: l.replace("backends/", "b/") for l in layers}
    width = max(len(l) for l in layers) + 1
    cols = [max(len(short[l]), 4) for l in layers]
    out.write("includes".ljust(width) + " ".join(short[l].rjust(c) for l, c in zip(layers, cols))
              + "\n")
    for row in layers:
        cells = []
        for col, c in zip(layers, cols):
            n = counts.get((row, col), 0)
            if n == 0:
                cell = "." if col in allowed.get(row, ()) else "-"
            else:
                cell = str(n) if col in allowed.get(row, ()) else f"!{n}"
            cells.append(cell.rjust(c))
        out.write(row.ljust(width) + " ".join(cells) + "\n")
    out.write("\nrows include columns; a number counts #include lines, '.' is allowed but unused, "
              "'-' not allowed, '!' marks an edge the table does not allow (b/ = backends/).\n")


def link_closure(targets, name, seen=None):
    """Every target `name` links, directly or through the targets it links (itself included)."""
    seen = set() if seen is None else seen
    if name in seen or name not in targets:
        return seen
    seen.add(name)
    for link in targets[name]["links"]:
        # $<LINK_LIBRARY:WHOLE_ARCHIVE,kiln_x> and $<LINK_ONLY:kiln_x> name kiln_x.
        for dep in re.findall(r"[A-Za-z0-9_]+", link):
            if dep in targets:
                link_closure(targets, dep, seen)
    return seen


def check_targets(graph_path, root, src_kiln):
    with open(graph_path, encoding="utf-8") as f:
        targets = json.load(f)
    owners = collections.defaultdict(set)  # folder relative to src/kiln -> targets defined there
    for name, t in targets.items():
        owners[os.path.relpath(os.path.join(root, t["dir"]), src_kiln)].add(name)
    errors = []
    for name, t in sorted(targets.items()):
        if t["type"] == "INTERFACE_LIBRARY":
            continue
        closure = link_closure(targets, name)
        visible = {d for d, ts in owners.items() if ts & closure}
        tdir = os.path.join(root, t["dir"])
        files = [s if os.path.isabs(s) else os.path.join(tdir, s) for s in t["sources"]]
        files = [f for f in files if f.endswith(SOURCE_EXTS) and os.path.isfile(f)]
        for path in files:
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
            for m in INCLUDE_RE.finditer(text):
                inc_dir = os.path.dirname(m.group(1))
                if inc_dir in visible:
                    continue
                line = text.count("\n", 0, m.start()) + 1
                want = ", ".join(sorted(owners.get(inc_dir, {"(no target)"})))
                errors.append(f"{os.path.relpath(path, root)}:{line}: {name} includes "
                              f"kiln/{m.group(1)} but links none of {want} (add it to DEPS, or "
                              "move the code to a layer that does)")
    # Headers: each must include only what the targets of its folder see together.
    for folder, names in sorted(owners.items()):
        visible = set()
        for n in names:
            closure = link_closure(targets, n)
            visible |= {d for d, ts in owners.items() if ts & closure}
        full = os.path.join(src_kiln, folder)
        for h in sorted(os.listdir(full)):
            if not h.endswith((".h", ".cuh", ".inc")):
                continue
            with open(os.path.join(full, h), encoding="utf-8", errors="replace") as fh:
                text = fh.read()
            for m in INCLUDE_RE.finditer(text):
                inc_dir = os.path.dirname(m.group(1))
                if inc_dir in visible:
                    continue
                line = text.count("\n", 0, m.start()) + 1
                errors.append(f"src/kiln/{folder}/{h}:{line}: includes kiln/{m.group(1)} but "
                              f"no target of src/kiln/{folder} ({', '.join(sorted(names))}) "
                              "links it")
    return errors


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.dirname(here), help="repository root")
    ap.add_argument("--matrix", action="store_true", help="print the layer matrix")
    ap.add_argument("--targets", help="BUILD/kiln_targets.json: also check includes against links")
    args = ap.parse_args()
    doc = os.path.join(args.root, "docs", "architecture.md")
    src_dir = os.path.join(args.root, "src")
    src_kiln = os.path.join(src_dir, "kiln")
    order, allowed = parse_table(doc)
    edges = list(scan_includes(src_kiln))
    if args.matrix:
        print_matrix(edges, order, allowed, sys.stdout)
    errors = check_layers(edges, order, allowed)
    if args.targets:
        errors += check_targets(args.targets, args.root, src_kiln)
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        print(f"check_layers: {len(errors)} include(s) break the layering "
              "(docs/architecture.md, ## Layers)", file=sys.stderr)
        return 1
    print(f"check_layers: {len(edges)} includes in src/kiln follow the layer table"
          + (" and the targets' links" if args.targets else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
