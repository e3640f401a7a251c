"""`kiln conformance --json` keeps the cases run so far in its report while the run goes on (at
most every 2 s), so a run killed by an outer time limit still leaves what it measured: the zoo
twenty times over (160 cases, about 16 s on two cores with cases sharing worker processes) is
killed as soon as its first report is written, and the file then holds a valid JSON list of
some, not all, of the cases, each a zoo case that passed."""
import argparse
import json
import os
import signal
import subprocess
import tempfile
import time

REPEAT = 20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--zoo", required=True)
    a = ap.parse_args()
    zoo_cases = {d for d in os.listdir(a.zoo) if os.path.exists(os.path.join(a.zoo, d, "model.onnx"))}
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        p = subprocess.Popen([a.kiln, "conformance", *[a.zoo] * REPEAT, "--rel-l2", "1e-4", "--json",
                              report],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        # Killed once the first report is written (the cases it names ran), not after a fixed
        # time: on a loaded machine (ctest -j) 5 s could pass before the first case ended. The
        # wait is bounded below the test's 60 s.
        deadline = time.monotonic() + 40
        while (time.monotonic() < deadline and p.poll() is None and
               not (os.path.exists(report) and os.path.getsize(report) > 0)):
            time.sleep(0.1)
        finished_early = p.poll() is not None
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        assert not finished_early, "the run ended before it was killed: make it longer"
        assert os.path.exists(report), "no report after 40 s of cases"
        with open(report) as f:
            cases = json.load(f)
        assert 1 <= len(cases) < REPEAT * len(zoo_cases), len(cases)
        for c in cases:
            assert c["name"] in zoo_cases and c["passed"], c
    print(f"ok: {len(cases)} of {REPEAT * len(zoo_cases)} cases in the report of a killed run")


if __name__ == "__main__":
    main()
