#!/usr/bin/env python3
"""tools/check_layers.py on small fixture trees: an allowed tree passes, an include the layer
table does not allow fails naming the file and line, an include of a target not linked fails
the --targets check, and --matrix counts the includes."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                      "check_layers.py")

DOC = """# fixture

## Layers

| Layer | May include |
| --- | --- |
| `core` | (nothing) |
| `ir` | `core` |
| `plan` | `core` `ir` |
| `backends` | `core` `ir` |
| `backends/cpu` | `core` `ir` `backends` |

## How to add an op

| Layer | May include |
| --- | --- |
| `core` | `plan` |
"""


def write(root, rel, text):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def tree(root, extra=None):
    write(root, "docs/architecture.md", DOC)
    write(root, "src/kiln/core/status.h", "#pragma once\n")
    write(root, "src/kiln/ir/graph.h", '#include "kiln/core/status.h"\n')
    write(root, "src/kiln/plan/plan.cc", '#include "kiln/ir/graph.h"\n#include "kiln/core/status.h"\n')
    write(root, "src/kiln/backends/kernel.h", '#include "kiln/ir/graph.h"\n')
    write(root, "src/kiln/backends/cpu/eval.cc", '#include "kiln/backends/kernel.h"\n')
    for rel, text in (extra or {}).items():
        write(root, rel, text)


def run(root, *args):
    p = subprocess.run([sys.executable, SCRIPT, "--root", root, *args], capture_output=True,
                       text=True, check=False)
    return p.returncode, p.stdout, p.stderr


class CheckLayersTest(unittest.TestCase):
    def test_allowed_tree_passes(self):
        with tempfile.TemporaryDirectory() as root:
            tree(root)
            rc, out, err = run(root)
            self.assertEqual(rc, 0, err)
            self.assertIn("5 includes", out)

    def test_upward_include_fails_with_file_and_line(self):
        with tempfile.TemporaryDirectory() as root:
            # plan reaching a backend's own header, and ir reaching up to plan (line 2).
            tree(root, {"src/kiln/plan/leak.cc": '#include "kiln/backends/cpu/eval.h"\n',
                        "src/kiln/ir/up.h": '#include "kiln/core/status.h"\n'
                                            '#include "kiln/plan/plan.h"\n',
                        # Only `## Layers` is the rule: the later table's core -> plan is not.
                        "src/kiln/core/x.h": '#include "kiln/plan/plan.h"\n'})
            rc, _, err = run(root)
            self.assertEqual(rc, 1)
            self.assertIn("src/kiln/plan/leak.cc:1: `plan` includes kiln/backends/cpu/eval.h "
                          "(`backends/cpu`)", err)
            self.assertIn("src/kiln/ir/up.h:2: `ir` includes kiln/plan/plan.h (`plan`)", err)
            self.assertIn("src/kiln/core/x.h:1: `core` includes kiln/plan/plan.h", err)
            self.assertIn("3 include(s) break the layering", err)

    def test_matrix_counts_includes(self):
        with tempfile.TemporaryDirectory() as root:
            tree(root, {"src/kiln/core/bad.h": '#include "kiln/ir/graph.h"\n'})
            rc, out, _ = run(root, "--matrix")
            self.assertEqual(rc, 1)
            rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:6]}
            header = out.splitlines()[0].split()[1:]
            self.assertEqual(header, ["core", "ir", "plan", "backends", "b/cpu"])
            self.assertEqual(rows["plan"][:3], ["1", "1", "."])  # plan -> core 1, ir 1, itself 0
            self.assertEqual(rows["core"][1], "!1")  # core -> ir is not allowed
            self.assertEqual(rows["backends/cpu"][3], "1")

    def test_include_of_a_target_not_linked_fails(self):
        with tempfile.TemporaryDirectory() as root:
            tree(root)
            targets = {
                "kiln_core": {"dir": "src/kiln/core", "type": "STATIC_LIBRARY", "links": [],
                              "sources": []},
                "kiln_ir": {"dir": "src/kiln/ir", "type": "STATIC_LIBRARY",
                            "links": ["kiln_core"], "sources": []},
                # Links core only, but plan.cc includes ir/graph.h.
                "kiln_plan": {"dir": "src/kiln/plan", "type": "STATIC_LIBRARY",
                              "links": ["kiln_core"], "sources": ["plan.cc"]},
                "kiln_backend": {"dir": "src/kiln/backends", "type": "STATIC_LIBRARY",
                                 "links": ["kiln_ir"], "sources": []},
                "kiln_cpu_impl": {"dir": "src/kiln/backends/cpu", "type": "STATIC_LIBRARY",
                                  "links": ["$<LINK_ONLY:kiln_backend>"], "sources": ["eval.cc"]},
                "kiln_cpu": {"dir": "src/kiln/backends/cpu", "type": "INTERFACE_LIBRARY",
                             "links": ["$<LINK_LIBRARY:WHOLE_ARCHIVE,kiln_cpu_impl>"],
                             "sources": []},
            }
            path = os.path.join(root, "targets.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(targets, f)
            rc, _, err = run(root, "--targets", path)
            self.assertEqual(rc, 1)
            self.assertIn("src/kiln/plan/plan.cc:1: kiln_plan includes kiln/ir/graph.h but links "
                          "none of kiln_ir", err)
            self.assertEqual(err.count("links none of"), 1, err)  # cpu reaches ir via backend
            targets["kiln_plan"]["links"] = ["kiln_ir"]
            with open(path, "w", encoding="utf-8") as f:
                json.dump(targets, f)
            rc, _, err = run(root, "--targets", path)
            self.assertEqual(rc, 0, err)


if __name__ == "__main__":
    unittest.main()
