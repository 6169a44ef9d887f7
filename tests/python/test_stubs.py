"""The typed stubs (python/dufu/*.pyi) describe the module that is built: every public
name and member of the extension has a stub and every stub names something real, and
the package's public functions and classes carry docstrings."""

import ast
import inspect
import os

import dufu
import dufu._dufu
import dufu.torch

PACKAGE_DIR = os.path.dirname(dufu.__file__)


def stub_names(filename):
    """{top-level name: set of member names (None for functions)} of a .pyi file."""
    tree = ast.parse(open(os.path.join(PACKAGE_DIR, filename)).read())
    names = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names[node.name] = {item.name for item in node.body if isinstance(item, ast.FunctionDef)}
        elif isinstance(node, ast.FunctionDef):
            names[node.name] = None
        elif isinstance(node, ast.ImportFrom) and node.level > 0:  # re-exports, not typing's names
            for alias in node.names:
                names[alias.asname or alias.name] = None
    return names


def public_members(cls):
    return {name for name in vars(cls) if not name.startswith("_") or name in ("__len__", "__getitem__", "__iter__")}


def test_extension_stub_matches_the_module():
    stubs = stub_names("_dufu.pyi")
    runtime = {name for name in dir(dufu._dufu) if not name.startswith("__")}
    assert set(stubs) == runtime
    for name, members in stubs.items():
        value = getattr(dufu._dufu, name)
        if members is None:
            continue
        missing = public_members(value) - members - {"__init__"}
        assert not missing, f"{name}: no stub for {sorted(missing)}"
        for member in members:
            assert hasattr(value, member), f"{name}.{member} is in the stub but not in the module"


def test_package_stubs_match_the_package():
    assert set(stub_names("__init__.pyi")) == set(dufu.__all__)
    torch_stubs = stub_names("torch.pyi")
    assert set(torch_stubs["DistributedIterableDataset"]) <= set(dir(dufu.torch.DistributedIterableDataset))


def test_public_api_has_docstrings():
    for name in dufu.__all__:
        value = getattr(dufu, name)
        assert inspect.getdoc(value), f"dufu.{name} has no docstring"
    for name in ("state_dict", "load_state_dict"):
        assert inspect.getdoc(getattr(dufu.DataLoader, name))
    assert inspect.getdoc(dufu.torch.DistributedIterableDataset)
