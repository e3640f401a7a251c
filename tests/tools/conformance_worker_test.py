"""`kiln conformance` runs cases in a worker process, one after another; a failed case ends the
worker and the next case starts in a new one, and a case past --timeout is killed. Checked: a
broken case between two zoo cases fails at import while both zoo cases pass, in order; with a
bound of 1 ms every case is reported as a timeout (KILN-E1004) and the run still reaches the
last case."""
import argparse
import json
import os
import shutil
import subprocess
import tempfile


def run(kiln, *args):
    return subprocess.run([kiln, "conformance", *args], capture_output=True, text=True, timeout=120)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--zoo", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        broken = os.path.join(tmp, "broken_case")
        shutil.copytree(os.path.join(a.zoo, "bert_tiny"), broken)
        with open(os.path.join(broken, "model.onnx"), "wb") as f:
            f.write(b"not an onnx model")
        report = os.path.join(tmp, "report.json")
        p = run(a.kiln, os.path.join(a.zoo, "bert_tiny"), broken, os.path.join(a.zoo, "gpt_tiny"),
                "--rel-l2", "1e-4", "--json", report)
        assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
        with open(report) as f:
            cases = json.load(f)
        got = [(c["name"], c["passed"], c["stage"]) for c in cases]
        assert got == [("bert_tiny", True, "ok"), ("broken_case", False, "import"),
                       ("gpt_tiny", True, "ok")], got
        p = run(a.kiln, os.path.join(a.zoo, "resnet_tiny"), os.path.join(a.zoo, "bert_tiny"),
                "--timeout", "0.001", "--json", report)
        assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
        with open(report) as f:
            cases = json.load(f)
        got = [(c["name"], c["stage"], c["code"]) for c in cases]
        assert got == [("resnet_tiny", "timeout", "KILN-E1004"),
                       ("bert_tiny", "timeout", "KILN-E1004")], got
    print("ok: failures restart the worker, timeouts kill it, the run goes on in order")


if __name__ == "__main__":
    main()
