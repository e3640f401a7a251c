"""Weight-stripped engines from the command line (issue 20): `kiln build --strip-weights` writes a
smaller engine that `kiln inspect` calls stripped and `kiln run` refuses with KILN-E4010 unless
given --weights; `kiln refit STRIPPED --weights MODEL -o FULL` writes the bytes `kiln build MODEL`
writes, and `kiln run STRIPPED --weights MODEL` gives the full engine's outputs bit for bit. Wrong
weights and damaged stripped files are refused with catalog errors, files unchanged."""
import argparse
import json
import os
import subprocess
import tempfile


def run(*args):
    return subprocess.run([*args], capture_output=True, text=True, timeout=120)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def outputs(a, engine, inputs, out_dir, *extra):
    r = run(a.kiln, "run", engine, *inputs, "--iterations", "1", "--warmup", "0", "--duration",
            "0", "--save-outputs", out_dir, *extra)
    assert r.returncode == 0, (r.stdout, r.stderr)
    return {n: read(os.path.join(out_dir, n)) for n in sorted(os.listdir(out_dir))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--source", required=True)
    a = ap.parse_args()
    zoo = os.path.join(a.source, "zoo")
    model_dir = os.path.join(zoo, "resnet_tiny")
    model = os.path.join(model_dir, "model.onnx")
    with open(os.path.join(model_dir, "info.json")) as f:
        p = json.load(f)["profile"]["input"]
    x = lambda v: "x".join(map(str, v))
    profile = ["--profile", f"input:{x(p['min'])},{x(p['opt'])},{x(p['max'])}"]
    inputs = ["--input", "input=" + os.path.join(model_dir, "test_data_set_0", "input_0.pb")]
    with tempfile.TemporaryDirectory() as tmp:
        path = lambda name: os.path.join(tmp, name)
        for fp16 in ([], ["--fp16"]):
            full, stripped, filled = path("full.kiln"), path("stripped.kiln"), path("filled.kiln")
            build = [a.kiln, "build", model, *profile, "--opt-level", "0", *fp16]
            r = run(*build, "-o", full)
            assert r.returncode == 0, r.stderr
            r = run(*build, "--strip-weights", "-o", stripped)
            assert r.returncode == 0, r.stderr
            assert "weights stripped: " in r.stdout and "kiln refit" in r.stdout, r.stdout
            assert os.path.getsize(stripped) * 4 < os.path.getsize(full), \
                (os.path.getsize(stripped), os.path.getsize(full))
            # inspect says so, in text and JSON.
            r = run(a.kiln, "inspect", stripped)
            assert r.returncode == 0 and "weights stripped: " in r.stdout, (r.stdout, r.stderr)
            r = run(a.kiln, "inspect", stripped, "--json")
            j = json.loads(r.stdout)
            assert j["header"]["weights_stripped"] is True, j["header"]
            assert j["refit"]["absent_constants"] == j["refit"]["weights"] > 0, j["refit"]
            assert j["refit"]["absent_bytes"] > 0, j["refit"]
            j = json.loads(run(a.kiln, "inspect", full, "--json").stdout)
            assert j["header"]["weights_stripped"] is False and j["refit"]["absent_bytes"] == 0
            # Running it without weights: the catalog error and what to do, never a crash.
            r = run(a.kiln, "run", stripped, "--iterations", "1")
            assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
            assert "KILN-E4010" in r.stderr and "--weights" in r.stderr, r.stderr
            # With --weights: the full engine's outputs, bit for bit; the file is not changed.
            before = read(stripped)
            want = outputs(a, full, inputs, path("out_full"))
            got = outputs(a, stripped, inputs, path("out_stripped"), "--weights", model)
            assert want and got == want, "kiln run --weights differs from the full engine"
            assert read(stripped) == before
            # kiln refit fills it: the full build's bytes; the stripped input is unchanged.
            r = run(a.kiln, "refit", stripped, "--weights", model, "-o", filled, "--json")
            assert r.returncode == 0, r.stderr
            assert json.loads(r.stdout)["filled_stripped"] is True
            assert read(filled) == read(full), "the filled engine differs from kiln build"
            assert read(stripped) == before
            # Another architecture's weights, in place: KILN-E4008, the file unchanged.
            r = run(a.kiln, "refit", stripped, "--weights", os.path.join(zoo, "bert_tiny",
                                                                           "model.onnx"))
            assert r.returncode == 1 and "KILN-E4008" in r.stderr, (r.returncode, r.stderr)
            assert read(stripped) == before
            r = run(a.kiln, "run", stripped, "--weights", os.path.join(zoo, "vit_tiny",
                                                                       "model.onnx"))
            assert r.returncode == 1 and "KILN-E4008" in r.stderr, (r.returncode, r.stderr)
            # A damaged stripped file: truncated or flipped, refused by the verifier.
            for name, data, code in (("cut.kiln", before[:len(before) // 2], "KILN-E4001"),
                                     ("flip.kiln", before[:100] + bytes([before[100] ^ 1]) +
                                      before[101:], "KILN-E4002")):
                with open(path(name), "wb") as f:
                    f.write(data)
                for cmd in (["inspect", path(name)], ["refit", path(name), "--weights", model,
                                                      "-o", path("x.kiln")]):
                    r = run(a.kiln, *cmd)
                    assert r.returncode == 1 and code in r.stderr, (cmd, r.returncode, r.stderr)
                assert not os.path.exists(path("x.kiln"))
        # Not with --distributed (the shared engine is a full one).
        r = run(a.kiln, "build", model, *profile, "--strip-weights", "--distributed",
                "--transport", "local", "-o", path("d.kiln"))
        assert r.returncode == 1 and "KILN-E1001" in r.stderr, (r.returncode, r.stderr)
    print("ok")


if __name__ == "__main__":
    main()
