"""`kiln refit` as users run it (issue 20): an engine built with weights A and refit with the ONNX
file of weights B is byte-identical to `kiln build` of B (same tactics at --opt-level 0); weights of
another architecture are refused with KILN-E4008 naming an initializer, and the engine file given
to be replaced in place is left as it was. INT8: the stored scales by default, and with
--recalibrate a fresh INT8 build's bytes."""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def run(*args):
    return subprocess.run([*args], capture_output=True, text=True, timeout=120)


def zoo_profile(zoo):
    """resnet_tiny's --profile from its info.json."""
    with open(os.path.join(zoo, "resnet_tiny", "info.json")) as f:
        p = json.load(f)["profile"]["input"]
    x = lambda v: "x".join(map(str, v))
    return ["--profile", f"input:{x(p['min'])},{x(p['opt'])},{x(p['max'])}"]


def models_and_engines(a, tmp, zoo, profile):
    """resnet_tiny as weights A and perturbed weights B, in directories of one name (their engines'
    headers name the same model), and each built at --opt-level 0 (the same tactics)."""
    perturb = os.path.join(a.source, "bench", "refit", "perturb_weights.py")
    for d in ("a", "b"):
        os.makedirs(os.path.join(tmp, d, "resnet_tiny"))
    model_a = os.path.join(tmp, "a", "resnet_tiny", "model.onnx")
    model_b = os.path.join(tmp, "b", "resnet_tiny", "model.onnx")
    os.symlink(os.path.join(zoo, "resnet_tiny", "model.onnx"), model_a)
    r = run(sys.executable, perturb, os.path.join(zoo, "resnet_tiny", "model.onnx"), model_b)
    assert r.returncode == 0, r.stderr
    engine_a, engine_b = os.path.join(tmp, "a.kiln"), os.path.join(tmp, "b.kiln")
    for model, engine in ((model_a, engine_a), (model_b, engine_b)):
        r = run(a.kiln, "build", model, *profile, "--opt-level", "0", "-o", engine)
        assert r.returncode == 0, r.stderr
    return model_a, model_b, engine_a, engine_b


def int8_refit(a, tmp, zoo, model_a, model_b, profile):
    """INT8: a refit keeps the stored activation scales (and says so); --recalibrate calibrates
    again with B and the same data, giving the engine `kiln build --int8` of B makes."""
    calib = os.path.join(zoo, "resnet_tiny")
    int8 = ["--int8", "--calib-dir", calib, "--int8-tolerance", "off", "--opt-level", "0",
            *profile]
    engine_a, engine_b = os.path.join(tmp, "a8.kiln"), os.path.join(tmp, "b8.kiln")
    for model, engine in ((model_a, engine_a), (model_b, engine_b)):
        r = run(a.kiln, "build", model, *int8, "-o", engine)
        assert r.returncode == 0, r.stderr
    with open(engine_b, "rb") as f:
        fresh = f.read()
    stored, recal = os.path.join(tmp, "stored8.kiln"), os.path.join(tmp, "recal8.kiln")
    r = run(a.kiln, "refit", engine_a, "--weights", model_b, "-o", stored)
    assert r.returncode == 0, r.stderr
    assert "re-quantise the new weights with the stored activation scales" in r.stdout, r.stdout
    with open(stored, "rb") as f:
        assert f.read() != fresh, "B's own calibration should give other scales than A's"
    r = run(a.kiln, "refit", engine_a, "--weights", model_b, "--recalibrate", "--calib-dir", calib,
            "-o", recal, "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["int8_scales"] == "recalibrated" and report["int8_layers"] > 0, report
    assert report["calibration"].startswith("minmax, 2 data set(s) from"), report
    with open(recal, "rb") as f:
        assert f.read() == fresh, "the recalibrated refit differs from a fresh INT8 build with B"
    # Calibration data without --recalibrate is a mistake, not silently ignored.
    r = run(a.kiln, "refit", engine_a, "--weights", model_b, "--calib-dir", calib, "-o", recal)
    assert r.returncode != 0 and "KILN-E1001" in r.stderr, (r.returncode, r.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--source", required=True)
    a = ap.parse_args()
    zoo = os.path.join(a.source, "zoo")
    profile = zoo_profile(zoo)
    with tempfile.TemporaryDirectory() as tmp:
        model_a, model_b, engine_a, engine_b = models_and_engines(a, tmp, zoo, profile)
        out = os.path.join(tmp, "refit.kiln")
        r = run(a.kiln, "refit", engine_a, "--weights", model_b, "-o", out, "--json")
        assert r.returncode == 0, r.stderr
        report = json.loads(r.stdout)
        assert report["constants_refit"] > 0 and report["bytes_refit"] > 0, report
        with open(out, "rb") as f1, open(engine_b, "rb") as f2, open(engine_a, "rb") as f3:
            refit, fresh, old = f1.read(), f2.read(), f3.read()
        assert refit == fresh, "the refit engine differs from a fresh build with weights B"
        assert refit != old
        # Another architecture's weights, in place: refused, the file unchanged.
        r = run(a.kiln, "refit", out, "--weights", os.path.join(zoo, "bert_tiny", "model.onnx"))
        assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
        assert "KILN-E4008" in r.stderr and "initializer '" in r.stderr, r.stderr
        with open(out, "rb") as f:
            assert f.read() == refit, "a refused refit changed the engine file"
        # Weights A in place: the file becomes A's engine again (but for nothing).
        r = run(a.kiln, "refit", out, "--weights", model_a)
        assert r.returncode == 0, r.stderr
        with open(out, "rb") as f:
            assert f.read() == old
        # The weight-free cache: B's build finds A's engine under the architecture's key and
        # refits it instead of building; the result is again B's engine, byte for byte.
        cache = os.path.join(tmp, "cache")
        os.mkdir(cache, 0o700)
        dist = ["--distributed", "--transport", "local", "--cache-dir", cache,
                "--weight-free-cache", "--opt-level", "0", *profile]
        r = run(a.kiln, "build", model_a, *dist, "-o", os.path.join(tmp, "wa.kiln"))
        assert r.returncode == 0 and '"role": "built"' in r.stdout, (r.stdout, r.stderr)
        wb = os.path.join(tmp, "wb.kiln")
        r = run(a.kiln, "build", model_b, *dist, "-o", wb)
        assert r.returncode == 0, r.stderr
        assert '"role": "cache-hit"' in r.stdout and "refit with this model's weights" in r.stdout, \
            r.stdout
        with open(wb, "rb") as f:
            assert f.read() == fresh, "the weight-free cache hit is not B's engine"
        assert len([n for n in os.listdir(cache) if n.endswith(".engine")]) == 1
        int8_refit(a, tmp, zoo, model_a, model_b, profile)
    print("ok")


if __name__ == "__main__":
    main()
