"""Hostile arguments: every numeric option refuses NaN, infinities and values outside its range
with KILN-E1016; a command line CLI11 cannot parse is KILN-E1015 (exit 64); names, addresses and
directories that do not exist are refused instead of ignored; `doctor logs` does not block on a
FIFO nor read /dev/zero forever; `inspect` refuses what `build` refuses."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostile  # noqa: E402

RANGE = "KILN-E1016"
USAGE = "KILN-E1015"
USAGE_EXIT = 64


def _junk_file(h, name):
    """An existing file for a positional argument that must exist; the options are refused first."""
    if not os.path.exists(h.path(name)):
        h.write(name, b"not a real file\n")
    return h.path(name)


def _all_refused(h, base, cases, code=RANGE):
    """Runs base + [flag, value] for each (flag, value); every one must be a clean refusal."""
    for flag, value in cases:
        r = h.refused(base + [flag, value], code=code, timeout=30)
        if r.rc != USAGE_EXIT:
            raise hostile.CaseFailure("%s %s: exit %d, expected %d" % (flag, value, r.rc, USAGE_EXIT))
        if flag not in r.err:
            raise hostile.CaseFailure("%s %s: the message does not name the option:\n%r" % (
                flag, value, r))


BAD_SECONDS = ["nan", "inf", "-inf", "-1", "0", "1e999"]


def case_run_numbers(h):
    engine = _junk_file(h, "e.kiln")
    cases = [("--duration", v) for v in ["nan", "inf", "-1", "1e999"]]
    cases += [("--iterations", v) for v in ["nan", "inf", "-1", "0", "1.5", "99999999999"]]
    cases += [("--warmup", v) for v in ["nan", "-1"]]
    cases += [("--layer-iterations", "-1"), ("--top-layers", "-1"), ("--seed", "-1"),
              ("--seed", "nan"), ("--metrics-port", "-1"), ("--metrics-port", "65536")]
    _all_refused(h, ["run", engine], cases)


def case_build_numbers(h):
    model = _junk_file(h, "m.onnx")
    cases = [("--max-kernel-time", v) for v in ["nan", "inf", "-1", "0"]]
    for flag in ["--join-timeout", "--wait-timeout", "--transfer-timeout"]:
        cases += [(flag, v) for v in BAD_SECONDS]
    cases += [("--deadline", v) for v in ["nan", "inf", "-1s", "0", "1e999s"]]
    cases += [("--calib-percentile", v) for v in ["nan", "0", "101", "-5"]]
    cases += [("--world-size", "0"), ("--world-size", "-2"), ("--rank", "-1"),
              ("--rank", "nan"), ("--metrics-port", "70000")]
    _all_refused(h, ["build", model, "-o", h.path("out.kiln")], cases)


def case_monitor_numbers(h):
    cases = [("--duration", v) for v in ["nan", "inf", "-1", "-5s"]]
    cases += [("--interval", v) for v in ["nan", "0", "-1s", "inf"]]
    cases += [("--collapse-window", "nan"), ("--throttle-window", "-1s")]
    cases += [(f, v) for f in ["--busy-ratio", "--idle-ratio", "--memory-pressure"]
              for v in ["nan", "inf", "-0.5", "2"]]
    cases += [("--metrics-port", "-1"), ("--metrics-port", "65536"),
              ("--metrics-bind", "999.1.1.1"), ("--metrics-bind", "localhost:80")]
    _all_refused(h, ["monitor", "--no-server", "--metrics-file", h.path("m.prom")], cases)


def case_doctor_numbers(h):
    log = _junk_file(h, "job.log")
    _all_refused(h, ["doctor"], [("--ranks-per-gpu", "0"), ("--ranks-per-gpu", "nan"),
                                 ("--ranks-per-gpu", "-1")])
    _all_refused(h, ["doctor", "logs", log], [("--chunk-mib", "0"), ("--chunk-mib", "nan"),
                                              ("--max-mib", "0"), ("--max-mib", "-1"),
                                              ("--year", "nan"), ("--year", "-2024")])


def case_cache_and_conformance_numbers(h):
    _all_refused(h, ["cache", "gc", "--dir", h.work], [("--older-than", "-1"),
                                                        ("--older-than", "nan"),
                                                        ("--max-bytes", "-1"),
                                                        ("--max-bytes", "inf")])
    _all_refused(h, ["conformance", h.work], [("--timeout", v) for v in BAD_SECONDS] +
                 [("--rel-l2", "nan"), ("--rel-l2", "-1"), ("--rel-l2", "0")])


def case_unknown_flag_and_missing_argument(h):
    for args in (["run", "--no-such-flag"], ["build"], ["--bogus"], ["no-such-command"],
                 ["cache"], ["cache", "ls", "extra"]):
        r = h.refused(args, code=USAGE, timeout=30)
        if r.rc != USAGE_EXIT:
            raise hostile.CaseFailure("%s: exit %d, expected %d" % (args, r.rc, USAGE_EXIT))


def case_wrong_type_is_a_range_error(h):
    r = h.refused(["run", _junk_file(h, "e.kiln"), "--iterations", "ten"], code=RANGE)
    if r.rc != USAGE_EXIT:
        raise hostile.CaseFailure("exit %d" % r.rc)


def case_missing_positional_file(h):
    r = h.refused(["inspect", h.path("nope.onnx")], code="KILN-E1003")
    if r.rc != USAGE_EXIT:
        raise hostile.CaseFailure("exit %d" % r.rc)


def case_help_and_version_still_succeed(h):
    for args in (["--help"], ["run", "--help"], ["--version"]):
        r = h.run(args, timeout=30)
        if r.rc != 0 or not r.out:
            raise hostile.CaseFailure("%s: %r" % (args, r))


def case_cache_verify_missing_dir(h):
    missing = h.path("no-such-cache")
    for sub in (["verify"], ["ls"], ["gc"]):
        h.refused(["cache"] + sub + ["--dir", missing], code="KILN-E1003")
    if os.path.exists(missing):
        raise hostile.CaseFailure("cache %s created the missing directory" % sub)


def _onnx():
    import onnx
    from onnx import TensorProto, helper
    return onnx, TensorProto, helper


def _relu_model(h, name="relu.onnx"):
    onnx, TensorProto, helper = _onnx()
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, h.path(name))
    return h.path(name)


def case_run_shapes_unknown_input(h):
    model = _relu_model(h)
    engine = h.path("relu.kiln")
    r = h.run(["build", model, "-o", engine, "--backend", "cpu"], timeout=120)
    if r.rc != 0:
        raise hostile.CaseFailure("could not build the test engine: %r" % r)
    h.freeze()
    r = h.refused(["run", engine, "--shapes", "nosuch:2x3", "--iterations", "1"],
                  code="KILN-E1003")
    if "nosuch" not in r.err or "x" not in r.err:
        raise hostile.CaseFailure("the message names neither the bad nor the real input: %r" % r)
    h.refused(["run", engine, "--input", "nosuch=" + model], code="KILN-E1003")
    ok = h.run(["run", engine, "--shapes", "x:2x3", "--iterations", "1", "--duration", "0",
                "--layer-iterations", "0"], timeout=60)
    if ok.rc != 0:
        raise hostile.CaseFailure("a correct --shapes was refused: %r" % ok)


def case_doctor_logs_fifo(h):
    fifo = h.path("pipe.log")
    os.mkfifo(fifo)
    h.refused(["doctor", "logs", fifo], code="KILN-E9003", timeout=20)


def case_doctor_logs_dev_zero(h):
    h.refused(["doctor", "logs", "/dev/zero"], code="KILN-E9003", timeout=20)
    # Asked for, it is read up to the cap and the output says so.
    r = h.run(["doctor", "logs", "--allow-special", "--max-mib", "2", "/dev/zero"], timeout=60)
    if r.rc < 0 or r.rc >= 3:
        raise hostile.CaseFailure("doctor logs on /dev/zero with a cap: %r" % r)
    if "first 2 MiB" not in r.out + r.err:
        raise hostile.CaseFailure("no note that the read was cut at the cap: %r" % r)


def case_doctor_logs_cap_on_a_regular_file(h):
    h.write("big.log", ("kiln: nothing to see here\n" * 90000).encode())  # ~2.3 MiB
    r = h.run(["doctor", "logs", "--max-mib", "1", h.path("big.log")], timeout=60)
    if r.rc < 0 or r.rc >= 3 or "first 1 MiB" not in r.out + r.err:
        raise hostile.CaseFailure("the cap on a regular file is not noted: %r" % r)
    r = h.run(["doctor", "logs", h.path("big.log")], timeout=60)
    if "first" in r.out + r.err and "MiB were read" in r.out + r.err:
        raise hostile.CaseFailure("a file under the default cap was reported cut: %r" % r)


def _save(h, name, build_graph):
    onnx, TensorProto, helper = _onnx()
    model = build_graph(onnx, TensorProto, helper)
    with open(h.path(name), "wb") as f:
        f.write(model.SerializeToString())  # no checker: the model is malformed on purpose
    return h.path(name)


def _both_refuse(h, model, code):
    h.refused(["inspect", model], code=code)
    h.refused(["inspect", "--json", model], code=code)
    h.refused(["build", model, "-o", h.path("out.kiln"), "--backend", "cpu"], code=code,
              timeout=120)


def case_inspect_cyclic_graph(h):
    def g(onnx, TensorProto, helper):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
        nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="n1"),
                 helper.make_node("Relu", ["a"], ["b"], name="n2"),
                 helper.make_node("Relu", ["a"], ["y"], name="n3")]
        return helper.make_model(helper.make_graph(nodes, "cyc", [x], [y]),
                                 opset_imports=[helper.make_opsetid("", 13)])
    _both_refuse(h, _save(h, "cycle.onnx", g), "KILN-E2005")


def case_inspect_undefined_value(h):
    def g(onnx, TensorProto, helper):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
        nodes = [helper.make_node("Add", ["x", "ghost"], ["y"], name="n1")]
        return helper.make_model(helper.make_graph(nodes, "undef", [x], [y]),
                                 opset_imports=[helper.make_opsetid("", 13)])
    _both_refuse(h, _save(h, "undefined.onnx", g), "KILN-E2006")


def case_inspect_bad_external_data(h):
    def g(onnx, TensorProto, helper):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
        w = helper.make_tensor("w", TensorProto.FLOAT, [4], [1.0, 2.0, 3.0, 4.0])
        w.ClearField("float_data")
        w.data_location = TensorProto.EXTERNAL
        for k, v in (("location", "weights.bin"), ("offset", "0"), ("length", "16")):
            e = w.external_data.add()
            e.key, e.value = k, v
        nodes = [helper.make_node("Add", ["x", "w"], ["y"], name="n1")]
        return helper.make_model(helper.make_graph(nodes, "ext", [x], [y], initializer=[w]),
                                 opset_imports=[helper.make_opsetid("", 13)])
    model = _save(h, "ext.onnx", g)
    h.write("weights.bin", b"\0" * 8)  # shorter than the 16 bytes the model names
    _both_refuse(h, model, "KILN-E2002")


def case_model_without_opset_import(h):
    def g(onnx, TensorProto, helper):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
        m = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                                                [x], [y]))
        del m.opset_import[:]
        return m
    model = _save(h, "noopset.onnx", g)
    for args in (["inspect", model], ["build", model, "-o", h.path("out.kiln")]):
        r = h.refused(args, code="KILN-E2010")
        if "opset_import" not in r.err or "cut short" in r.err:
            raise hostile.CaseFailure("the message does not say what is missing: %r" % r)


if __name__ == "__main__":
    hostile.main(globals())
