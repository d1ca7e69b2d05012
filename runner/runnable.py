"""Tell "cannot run on this machine" apart from "broken by the change".

A CUDA repo's tests often cannot even be imported on a CPU box: the compiled
extension (``_C``, ``*_cuda``) was never built, torch has no CUDA, triton finds
no driver, an optional module is not installed. Such a suite is
``not-runnable`` here, with a one-line reason, and never fails the verdict.
An import error the change itself caused stays a failure: a name missing from
a ``.py`` module of the tree, or a module of the tree that is gone.

Reads the suite's JUnit XML (pytest writes one ``collection failure`` case
per module it could not import) and, for other commands, the last exception
in the output tail. Standard library only: this runs on bare GPU images.
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from functools import lru_cache

SOURCE_ROOTS = ("", "src", "python", "lib")
REASON_CHARS = 300

# Messages that mean "no usable GPU here", whatever raised them.
NO_DEVICE = re.compile(
    r"Torch not compiled with CUDA enabled|No CUDA GPUs are available|Found no NVIDIA driver"
    r"|no CUDA-capable device is detected|CUDA driver initialization failed|cudaErrorNoDevice"
    r"|CUDA_ERROR_NO_DEVICE|NVIDIA driver on your system is too old|0 active drivers"
    r"|libcuda\.so[.\d]*: cannot open shared object file|CUDA is not available|no GPU available"
    r"|cudaErrorInsufficientDriver"
)
# A built library that is there but does not load here (other CUDA/torch ABI, missing system lib).
NO_LOAD = re.compile(r"\.so[.\d]*: cannot open shared object file|undefined symbol: |\.so: invalid ELF header")
_EXC = re.compile(r"^(?:E\s+)?((?:\w+\.)*(?:\w*Error|\w*Exception)): (.+)$")
_NO_MODULE = re.compile(r"No module named '([\w.]+)'")
_NO_NAME = re.compile(r"cannot import name '(\w+)' from (?:partially initialized module )?'([\w.]+)'")
# Leaf names that build systems give compiled extensions.
# Private module names (``_launch``) are not enough: a PR that deletes ``pkg/_launch.py`` must still fail.
EXTENSION_NAME = re.compile(r"_C$|_cuda$|_cpp$|_ext$|_cuda_\w+$")
_BUILD_DECL = (
    re.compile(r"(?:CUDA|Cpp|Pybind11|)Extension\(\s*(?:name\s*=\s*)?['\"]([\w.]+)['\"]"),
    re.compile(r"(?:pybind11_add_module|nanobind_add_module|[Pp]ython_add_library)\(\s*(\w+)"),
    re.compile(r"TORCH_EXTENSION_NAME\s*=\s*['\"]?(\w+)"),
)
BUILD_FILES = ("setup.py", "CMakeLists.txt", "csrc/CMakeLists.txt", "pyproject.toml", "build.sh")


@dataclass(frozen=True)
class Verdict:
    """Why one import failure happened: the environment (``runnable=False``) or the code."""

    runnable: bool
    reason: str


@lru_cache(maxsize=64)
def declared_extensions(repo_dir: str) -> frozenset[str]:
    """Leaf names of the compiled modules the repo's build files produce (``deep_gemm._C`` → ``_C``)."""
    names: set[str] = set()
    for rel in BUILD_FILES:
        try:
            with open(os.path.join(repo_dir, rel), encoding="utf-8", errors="replace") as fh:
                text = fh.read(512 * 1024)
        except OSError:
            continue
        names |= extension_names(text)
    return frozenset(names)


def extension_names(build_file_text: str) -> frozenset[str]:
    """Leaf names of the compiled modules a setup.py / CMakeLists.txt declares."""
    return frozenset(
        m.group(1).rsplit(".", 1)[-1] for pattern in _BUILD_DECL for m in pattern.finditer(build_file_text)
    )


def _in_tree(repo_dir: str, dotted: str) -> bool:
    """Whether ``dotted`` is a Python module or package of the tree (under a usual source root)."""
    rel = dotted.replace(".", "/")
    for root in SOURCE_ROOTS:
        base = os.path.join(repo_dir, root, rel)
        if os.path.isfile(base + ".py") or os.path.isfile(os.path.join(base, "__init__.py")):
            return True
    return False


def _package_in_tree(repo_dir: str, dotted: str) -> bool:
    rel = dotted.replace(".", "/")
    return any(os.path.isdir(os.path.join(repo_dir, root, rel)) for root in SOURCE_ROOTS)


def _is_extension(repo_dir: str, leaf: str) -> bool:
    return leaf in declared_extensions(repo_dir) or bool(EXTENSION_NAME.search(leaf))


def judge(exc_type: str, message: str, repo_dir: str) -> Verdict:
    """Whether an exception seen while importing a test means "not runnable here"."""
    text = f"{exc_type}: {message}"
    short = text[:REASON_CHARS]
    if NO_DEVICE.search(text):
        return Verdict(False, f"no usable GPU here ({short})")
    if exc_type.endswith(("ImportError", "ModuleNotFoundError", "OSError")) and NO_LOAD.search(text):
        return Verdict(False, f"a built library does not load here ({short})")
    m = _NO_MODULE.search(message)
    if m and exc_type.endswith(("ModuleNotFoundError", "ImportError")):
        dotted = m.group(1)
        parent, _, leaf = dotted.rpartition(".")
        if _in_tree(repo_dir, dotted):
            return Verdict(True, short)  # it is there: something inside it failed
        if not parent or not _package_in_tree(repo_dir, dotted.split(".", 1)[0]):
            return Verdict(False, f"module '{dotted}' is not installed here")
        if _is_extension(repo_dir, leaf):
            return Verdict(False, f"extension '{dotted}' is not built here")
        return Verdict(True, short)  # a module of the tree is gone
    m = _NO_NAME.search(message)
    if m and exc_type.endswith("ImportError"):
        name, module = m.group(1), m.group(2)
        if not _in_tree(repo_dir, f"{module}.{name}") and _package_in_tree(repo_dir, module.split(".", 1)[0]) \
                and _is_extension(repo_dir, name):
            return Verdict(False, f"extension '{module}.{name}' is not built here")
        if not _package_in_tree(repo_dir, module.split(".", 1)[0]) and not _in_tree(repo_dir, module):
            return Verdict(False, f"installed module '{module}' lacks '{name}' here")
        return Verdict(True, short)
    return Verdict(True, short)


def last_exception(text: str) -> tuple[str, str] | None:
    """The last ``Type: message`` line of a traceback (pytest's ``E   `` lines included)."""
    found = None
    for line in text.splitlines():
        m = _EXC.match(line.strip() if not line.startswith("E ") else line)
        if m:
            found = (m.group(1), m.group(2).strip())
    return found


@dataclass
class Collection:
    """What pytest could not collect, from its JUnit XML."""

    failures: dict[str, Verdict]  # test module → why it could not be imported
    ran: int  # cases that are not collection failures


def read_collection(junit_path: str, repo_dir: str) -> Collection:
    try:
        root = ET.parse(junit_path).getroot()
    except (ET.ParseError, OSError):
        return Collection({}, 0)
    failures: dict[str, Verdict] = {}
    ran = 0
    for tc in root.iter("testcase"):
        err = tc.find("error")
        if err is None or (err.get("message") or "") != "collection failure":
            ran += 1
            continue
        where = tc.get("file") or (tc.get("name") or "?").replace(".", "/") + ".py"
        exc = last_exception(err.text or "")
        failures[where] = judge(*exc, repo_dir) if exc else Verdict(True, "collection failure")
    return Collection(failures, ran)


def not_runnable(
    junit_path: str | None, tail: str, repo_dir: str, rc: int, failed_messages: list[str]
) -> tuple[str, dict[str, str]] | None:
    """(reason, {test module: reason}) when the suite could not run here; None when it ran or broke.

    Any import failure the change could have caused keeps the suite a failure,
    even next to modules that are only not runnable.
    """
    if rc == 0:
        return None
    coll = read_collection(junit_path, repo_dir) if junit_path and os.path.exists(junit_path) else Collection({}, 0)
    if coll.failures:
        if any(v.runnable for v in coll.failures.values()):
            return None
        reasons = {path: v.reason for path, v in coll.failures.items()}
        return _summary(reasons), reasons
    if failed_messages:  # tests ran: only "every failure is a missing GPU" counts
        if all(NO_DEVICE.search(msg) for msg in failed_messages):
            reason = f"no usable GPU here ({failed_messages[0][:REASON_CHARS]})"
            return reason, {}
        return None
    if coll.ran:
        return None
    exc = last_exception(tail)
    if exc is None:
        return None
    verdict = judge(*exc, repo_dir)
    return (None if verdict.runnable else (verdict.reason, {}))


def _summary(reasons: dict[str, str]) -> str:
    distinct = list(dict.fromkeys(reasons.values()))
    head = distinct[0] + (f" (and {len(distinct) - 1} other reason(s))" if len(distinct) > 1 else "")
    n = len(reasons)
    return f"{n} test module(s) cannot be imported here: {head}"[: REASON_CHARS + 80]
