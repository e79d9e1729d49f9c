"""Real Python projects and real venvs for the "what the gate sees" tests (issue 22, item 1).

A fixture project (src or flat layout) with its own in-tree PEP 517/660 build backend, so
``pip install --no-build-isolation -e .`` works offline with nothing but pip: the editable wheel it
builds carries a ``.pth`` naming the project's import root, exactly what hatchling, flit and
setuptools' src-layout mode install. A venv made here sees the test run's own site-packages (for
pytest and pip) through one ``.pth`` line; its ``bin/pytest`` is the console script pip writes for
pytest, byte for byte.

Run as a program it does one set-up step in the current directory (the worktree's ``[workspace]
setup`` in the tests calls it): ``python pyfixture.py venv DIR [--pytest]`` makes a venv without pip
that sees the test run's packages; ``python pyfixture.py host DIR`` only adds that ``.pth`` to an
existing venv (one made by ``python3 -m venv``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

BACKEND = '''"""In-tree build backend (PEP 517/660): an editable wheel is one .pth naming the import root."""
import base64, hashlib, os, tomllib, zipfile


def _meta():
    with open("pyproject.toml", "rb") as fh:
        project = tomllib.load(fh)["project"]
    return project["name"], project["version"]


def _root():
    return os.path.join(os.getcwd(), "src") if os.path.isdir("src") else os.getcwd()


def _wheel(directory, files, tag):
    name, version = _meta()
    dist = f"{name.replace('-', '_')}-{version}"
    files = {**files,
             f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\\nName: {name}\\nVersion: {version}\\n",
             f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\\nGenerator: fixture\\nRoot-Is-Purelib: true\\n"
                                        "Tag: py3-none-any\\n"}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = "\\n".join(record) + "\\n"
    wheel = f"{dist}-{tag}py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(directory, wheel), "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return wheel


def get_requires_for_build_editable(config_settings=None):
    return []


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    name, version = _meta()
    return _wheel(wheel_directory, {f"__editable__.{name}-{version}.pth": _root() + "\\n"}, "0.editable-")


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    root, files = _root(), {}
    for name in os.listdir(root):
        if name.isidentifier() and os.path.isfile(os.path.join(root, name, "__init__.py")):
            for base, _dirs, names in os.walk(os.path.join(root, name)):
                for n in names:
                    if n.endswith(".py"):
                        full = os.path.join(base, n)
                        with open(full, encoding="utf-8") as fh:
                            files[os.path.relpath(full, root)] = fh.read()
    return _wheel(wheel_directory, files, "")


def build_sdist(sdist_directory, config_settings=None):
    raise NotImplementedError("no sdist for the fixture")
'''

GOOD = 'def verify_signature(data: bytes, sig: str) -> bool:\n    return sig == "ok:" + data.decode()\n'
BROKEN = 'def verify_signature(data: bytes, sig: str) -> bool:\n    return True\n'
TEST = (
    "from mypkg import verify_signature\n\n\n"
    "def test_good() -> None:\n    assert verify_signature(b'x', 'ok:x')\n\n\n"
    "def test_bad() -> None:\n    assert not verify_signature(b'x', 'forged')\n"
)
ADDED = GOOD + '\n\ndef sign(data: bytes) -> str:\n    return "ok:" + data.decode()\n'
ADDED_TEST = (
    "from mypkg import sign, verify_signature\n\n\n"
    "def test_sign_round_trip() -> None:\n    assert verify_signature(b'y', sign(b'y'))\n"
)

# pip's console-script template (pip/_internal/operations/install/wheel.py, via distlib), for pytest.
PYTEST_SCRIPT = """#!{python}
# -*- coding: utf-8 -*-
import re
import sys
from pytest import console_main
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(console_main())
"""


def package_dir(repo: Path, layout: str) -> Path:
    return repo / "src" / "mypkg" if layout == "src" else repo / "mypkg"


def make_project(repo: Path, layout: str = "src") -> Path:
    """The fixture project in ``repo`` (not committed); the path of its package's ``__init__.py``."""
    (repo / "_build").mkdir(exist_ok=True)
    (repo / "_build" / "fixture_backend.py").write_text(BACKEND, encoding="utf-8")
    (repo / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "fixture_backend"\nbackend-path = ["_build"]\n\n'
        '[project]\nname = "mypkg"\nversion = "0.1"\n', encoding="utf-8")
    pkg = package_dir(repo, layout)
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(GOOD, encoding="utf-8")
    (repo / "tests").mkdir(exist_ok=True)
    (repo / "tests" / "test_sig.py").write_text(TEST, encoding="utf-8")
    with open(repo / ".gitignore", "a", encoding="utf-8") as fh:
        fh.write(".venv/\n__pycache__/\n*.egg-info/\n")
    return pkg / "__init__.py"


def host_site() -> str:
    """Where this test run's own packages are (pytest, pip)."""
    return sysconfig.get_paths()["purelib"]


def add_host(venv: Path) -> None:
    """Let ``venv`` import the test run's packages (pytest, pip): one .pth line, as a site dir would."""
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "_evolve_test_host.pth").write_text(host_site() + "\n", encoding="utf-8")


def make_venv(venv: Path, *, pytest_script: bool = True) -> Path:
    """A real venv (``python -m venv``) that sees the test run's packages; its python."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    add_host(venv)
    python = venv / "bin" / "python"
    if pytest_script:
        script = venv / "bin" / "pytest"
        script.write_text(PYTEST_SCRIPT.format(python=python), encoding="utf-8")
        script.chmod(0o755)
    return python


def install_editable(python: Path, project: Path) -> None:
    """``pip install --no-build-isolation --no-deps -e project`` with the venv's own interpreter."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV"))}
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                    "--no-index", "--disable-pip-version-check", "-e", str(project)],
                   check=True, capture_output=True, cwd=project, env=env)


def install_copy(python: Path, project: Path) -> None:
    """A non-editable install (``pip install .``): the venv then holds a copy of the package."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON", "VIRTUAL_ENV"))}
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                    "--no-index", "--disable-pip-version-check", str(project)],
                   check=True, capture_output=True, cwd=project, env=env)


def operator_venv(repo: Path, layout: str = "src") -> Path:
    """The usual set-up: the project in ``repo``, a venv in the checkout, the project installed editable.
    Returns the venv's bin directory (what an activated venv puts first on PATH)."""
    make_project(repo, layout)
    python = make_venv(repo / ".venv")
    install_editable(python, repo)
    return repo / ".venv" / "bin"


def main(argv: list[str]) -> int:
    if argv[:1] == ["venv"] and len(argv) >= 2:
        make_venv(Path(argv[1]).absolute(), pytest_script="--pytest" in argv)
        return 0
    if argv[:1] == ["host"] and len(argv) == 2:
        add_host(Path(argv[1]).absolute())
        return 0
    print("usage: pyfixture.py venv DIR [--pytest] | host DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
