# The type stubs (python/kiln/*.pyi) cover the public API: every public name, every public method,
# property and attribute of the public classes, and every named parameter of the public functions.
import ast
import inspect
import os

import torch

import kiln
import kiln.distributed
from conftest import ROOT

STUBS = os.path.join(ROOT, "python", "kiln")


def stub(module_file):
    with open(os.path.join(STUBS, module_file)) as f:
        tree = ast.parse(f.read())
    names, classes, functions = set(), {}, {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.FunctionDef):
            names.add(node.name)
            functions[node.name] = node
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            members = {}
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    members[item.name] = item
                elif isinstance(item, ast.AnnAssign):
                    members[item.target.id] = item
            classes[node.name] = members
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names, classes, functions


def params(fn):
    a = fn.args
    return {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}


def runtime_params(fn):
    return {n for n, p in inspect.signature(fn).parameters.items()
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


def check_functions(module, functions, names):
    for name in names:
        obj = getattr(module, name)
        if inspect.isfunction(obj):
            assert name in functions, f"{module.__name__}.{name} has no stub"
            missing = runtime_params(obj) - params(functions[name])
            assert not missing, f"{module.__name__}.{name}: stub lacks {missing}"


def test_every_public_name_of_kiln_has_a_stub(engine):
    names, classes, functions = stub("__init__.pyi")
    assert set(kiln.__all__) <= names, set(kiln.__all__) - names
    check_functions(kiln, functions, kiln.__all__)
    ctx = engine.create_execution_context()
    instances = {"Engine": engine, "ExecutionContext": ctx, "KilnError": None,
                 "TensorInfo": engine.inputs[0]}
    for cls_name, instance in instances.items():
        cls = getattr(kiln, cls_name)
        members = classes[cls_name]
        public = {n for n in vars(cls) if not n.startswith("_")}
        if instance is not None:
            public |= {n for n in vars(instance) if not n.startswith("_")} if hasattr(
                instance, "__dict__") else set()
        if cls_name == "KilnError":
            public |= {"number", "code", "name", "message", "remedy", "builder_code"}
        if cls_name == "TensorInfo":
            public = set(cls._fields)
        missing = public - set(members)
        assert not missing, f"kiln.{cls_name}: stub lacks {missing}"
        for n, fn in vars(cls).items():
            if inspect.isfunction(fn) and not n.startswith("_"):
                lacking = runtime_params(fn) - params(members[n])
                assert not lacking, f"kiln.{cls_name}.{n}: stub lacks {lacking}"


def test_kiln_distributed_stub():
    names, _, functions = stub("distributed.pyi")
    assert set(kiln.distributed.__all__) <= names
    check_functions(kiln.distributed, functions, kiln.distributed.__all__)
    # kiln.build forwards these to kiln.distributed: its stub names them too.
    _, _, top = stub("__init__.pyi")
    forwarded = runtime_params(kiln.distributed.build) - {"model", "example_inputs", "group"}
    assert forwarded <= params(top["build"]), forwarded - params(top["build"])


def test_stubs_are_shipped():
    assert os.path.exists(os.path.join(STUBS, "py.typed"))
    assert torch  # the stubs name torch types
