# The GPU figure scripts' CPU paths, so that the lead's H200 run is known to start: gpu_train.sh
# (examples/train.py, world size 1, then call_overhead.py) with --device cpu, and
# bench/python/call_overhead.py --tiny.
import json
import os
import subprocess
import sys

from conftest import ROOT


def test_gpu_train_script_on_the_cpu(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path), OMP_NUM_THREADS="1", PYTHON=sys.executable)
    p = subprocess.run(
        [os.path.join(ROOT, "scripts", "gpu_train.sh"), "--device", "cpu", "--epochs", "3", "--",
         "--train-size", "256", "--val-size", "64"],
        env=env, capture_output=True, text=True, timeout=500)
    assert p.returncode == 0, p.stdout + p.stderr
    table = json.loads((tmp_path / "train.json").read_text())
    assert table["world_size"] == 1 and table["device"] == "cpu"
    assert table["process_group"] == "gloo" and table["pg_init_s"] > 0
    assert [r["epoch"] for r in table["epochs"]] == [0, 1, 2]
    for r in table["epochs"]:
        assert r["builds"] == 1 and r["builders"] == [0] and r["ok"], r
        assert r["build_s"] > 0 and r["build_wall_s"] >= r["build_s"] * 0.5
        assert r["max_kernel_ms"] >= 0 and r["peak_mem_mib"] > 50 and r["end_mem_mib"] > 50
        assert r["peak_mem_mib"] >= r["end_mem_mib"] * 0.9
        assert r["util_pct"] is not None and 0 <= r["util_pct"] <= 100
        assert abs(r["val_loss_kiln"] - r["val_loss_torch"]) < 0.05
    # With three epochs the steady ones (1, 2) are judged: memory after each epoch stays flat.
    assert table["flat"]["end_mem"]["ok"] is True, table["flat"]
    assert table["flat"]["peak_mem"]["ok"] is not None
    text = (tmp_path / "train.txt").read_text()
    assert "examples/train.py --device cpu --epochs 3" in text.splitlines()[1]
    assert "verification (1 rank(s), cpu" in text and "flat end_mem: yes" in text
    over = json.loads((tmp_path / "call_overhead.json").read_text())
    assert over["backend"] == "cpu" and over["batch"] == 1
    assert over["cpp_enqueue_us"] > 0 and over["ctypes_execute_us"] > 0
    assert over["python_run_us"] > 0
    assert abs(over["overhead_us"] - (over["python_run_us"] - over["cpp_enqueue_us"])) < 0.02
    assert "run_over_ctypes_execute_us" in over
    # Both paths of context.run, in one process: kiln._fast (when this build made it) ran every
    # timed call of its context, and both wrote the same outputs.
    assert over["ctypes_run_us"] > 0 and over["call_us"] > 0
    assert over["fast_and_ctypes_outputs_equal"] is True
    assert over["fast_path"] is (os.environ.get("KILN_PYTHON_FAST_BUILT") == "1")
    assert over["fast_runs_counted"] == over["fast_runs_expected"]
    assert over["ratio_ctypes_run_to_fast_run"] > 0 and len(over["round_medians_us"]) == 10
    assert len(over["cpp_enqueue_runs_us"]) == 3 and over["side_stream"] == {}
    assert "overhead of context.run over the C++ enqueue" in (
        tmp_path / "call_overhead.txt").read_text()


def test_model_sweep_script(tmp_path):
    """bench/models/sweep.py (issue 21's real-model sweep): a torchvision model exported with
    random weights passes kiln conformance against PyTorch's FP32 output; a kiln that fails is a
    row with its reason, not a crash; --table reads the JSON back."""
    kiln = os.environ.get("KILN_EXE")
    assert kiln, "CTest sets KILN_EXE"
    script = os.path.join(ROOT, "bench", "models", "sweep.py")
    out = tmp_path / "sweep.json"
    p = subprocess.run([sys.executable, script, "--kiln", kiln, "--models", "squeezenet1_1",
                        "--work", str(tmp_path / "w"), "--out", str(out)],
                       capture_output=True, text=True, timeout=500)
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(out.read_text())
    (row,) = res["rows"]
    assert row["model"] == "squeezenet1_1" and row["exported"] and row["passed"], row
    assert row["inputs"] == {"input": [1, 3, 224, 224]}
    assert (tmp_path / "w" / "squeezenet1_1" / "test_data_set_0" / "output_0.pb").exists()
    assert "1 of 1 exported models pass on cpu (100.0%)" in p.stdout
    # The same case with a kiln that cannot build it: a failed row with the reason.
    bad = tmp_path / "bad.json"
    p = subprocess.run([sys.executable, script, "--kiln", "/bin/false", "--models",
                        "squeezenet1_1", "--out", str(bad)],
                       capture_output=True, text=True, timeout=500)
    assert p.returncode == 0, p.stdout + p.stderr
    (row,) = json.loads(bad.read_text())["rows"]
    assert row["exported"] and not row["passed"] and row["reason"], row
    p = subprocess.run([sys.executable, script, "--table", str(bad)], capture_output=True,
                       text=True, timeout=60)
    assert "| squeezenet1_1 | classification | ok | FAIL |" in p.stdout
    assert "0 of 1 exported models pass on cpu (0.0%)" in p.stdout
