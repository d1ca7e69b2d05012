"""Calls fit their callee: a PR that changes a function's parameters and leaves a caller in another file on the old
ones, or adds a call the function cannot take, is caught with both places cited; calls the check cannot judge
(splats, shadowed names, decorated or re-bound callees, misfits the base already had) are left alone."""

from __future__ import annotations

from checks.audit import run_checks
from checks.config import parse_config
from checks.diff import build_changeset
from checks.infer.calls import RULE_ID, Sig, read_module
from checks.model import AuditRequest
from checks.workspace import checkout
from tests.gitrepo import GitRepo
from tests.infer.audits import audit, inferred

OPS = '''"""Kernel wrappers."""


def rms_norm(x, weight, eps=1e-6):
    return x


def fused_add(x, residual, *, inplace=False):
    return x


class Quantizer:
    def __init__(self, bits, group_size=128):
        self.bits = bits
'''

LAYERS = '''from engine.ops import fused_add, rms_norm
from engine import ops as kernels


class Norm:
    def forward(self, x, w):
        y = rms_norm(x, w)
        return fused_add(y, x, inplace=True)


def build(bits):
    return kernels.Quantizer(bits)
'''

INIT = "from engine.ops import rms_norm\n"

USER = '''from . import rms_norm


def apply(x, w):
    return rms_norm(x, w, 1e-5)
'''


def _repo(tmp_path):
    r = GitRepo(tmp_path / "eng")
    base = r.commit_files({"engine/__init__.py": INIT, "engine/ops.py": OPS, "engine/layers.py": LAYERS,
                           "engine/user.py": USER}, "engine")
    return r, base


def calls_found(found) -> list:
    return [f for f in inferred(found) if f.rule == RULE_ID]


def test_a_parameter_added_in_front_is_caught_at_every_caller_left_behind(tmp_path):
    r, base = _repo(tmp_path)
    head = r.commit_files({"engine/ops.py": OPS.replace("def rms_norm(x, weight, eps=1e-6)",
                                                        "def rms_norm(x, weight, bias, eps=1e-6)")}, "rms_norm bias")
    got = calls_found(audit(r.path, base, head))
    where = sorted((f.locations[0].path, f.locations[0].line) for f in got)
    # layers.py passes (x, w): bias missing; user.py (through the package's re-export) passes eps as bias: fits
    assert where == [("engine/layers.py", 7)], [f.message for f in got]
    msg = got[0].message
    assert msg == ("the call `rms_norm(x, w)` (engine/layers.py:7) does not fit `rms_norm`: it needs `bias`, which the "
                   "call does not pass. `rms_norm` takes `(x, weight, bias, eps=…)` (engine/ops.py:4, whose parameters "
                   "this PR changes). At the base it took `(x, weight, eps=…)`. Fix: pass what it takes now, or keep "
                   "the parameters its callers pass."), msg
    assert [(loc.path, loc.note) for loc in got[0].locations] == [("engine/layers.py", "the call"),
                                                                    ("engine/ops.py", "the callee")]
    assert got[0].status == "new" and got[0].severity == "warning"
    # the callers updated with it: nothing to say
    fixed = r.commit_files({"engine/layers.py": LAYERS.replace("rms_norm(x, w)", "rms_norm(x, w, None)")}, "fix")
    assert calls_found(audit(r.path, base, fixed)) == []


def test_a_removed_parameter_a_renamed_keyword_and_a_constructor_through_a_module_alias(tmp_path):
    r, base = _repo(tmp_path)
    head = r.commit_files({"engine/ops.py": OPS.replace("*, inplace=False", "*, in_place=False")
                          .replace("def rms_norm(x, weight, eps=1e-6)", "def rms_norm(x, weight)")
                          .replace("def __init__(self, bits, group_size=128)", "def __init__(self, qtype, bits)")},
                          "rename")
    got = {(f.locations[0].path, f.locations[0].line): f.message for f in calls_found(audit(r.path, base, head))}
    assert set(got) == {("engine/layers.py", 8), ("engine/layers.py", 12), ("engine/user.py", 5)}, got
    assert "it has no parameter `inplace`" in got[("engine/layers.py", 8)]
    assert "`Quantizer.__init__` takes `(qtype, bits)`" in got[("engine/layers.py", 12)]
    assert "it needs `bits`" in got[("engine/layers.py", 12)]
    assert "it takes at most 2 positional arguments, the call passes 3" in got[("engine/user.py", 5)]


def test_a_base_class_constructor_change_reaches_subclasses_through_super(tmp_path):
    r = GitRepo(tmp_path / "w")
    weight = "class MMWeight:\n    def __init__(self, name, dtype, split=0):\n        self.name = name\n"
    sub = ("from pkg.base import MMWeight\n\n\nclass RowWeight(MMWeight):\n    def __init__(self, name, dtype):\n"
           "        super().__init__(name, dtype)\n\n\nclass Mixin:\n    pass\n\n\n"
           "class Both(MMWeight, Mixin):\n    def __init__(self, name):\n        super().__init__(name)\n")
    base = r.commit_files({"pkg/__init__.py": "", "pkg/base.py": weight, "pkg/row.py": sub}, "weights")
    head = r.commit_files({"pkg/base.py": weight.replace("dtype, split=0", "dtype, tp_rank, split=0")}, "tp rank")
    got = calls_found(audit(r.path, base, head))
    # RowWeight's super().__init__ no longer fits; Both has two bases (its MRO is not read), and already misfit
    assert [(f.locations[0].path, f.locations[0].line) for f in got] == [("pkg/row.py", 6)], [f.message for f in got]
    assert "does not fit `MMWeight.__init__`: it needs `tp_rank`" in got[0].message


def test_a_new_call_that_does_not_fit_an_unchanged_function(tmp_path):
    r, base = _repo(tmp_path)
    head = r.commit_files({"engine/user.py": USER + "\n\ndef more(x, w):\n    return rms_norm(x, w, eps=1e-5, "
                                                    "scale=2)\n"}, "more")
    got = calls_found(audit(r.path, base, head))
    assert [(f.locations[0].path, f.locations[0].line) for f in got] == [("engine/user.py", 9)]
    assert "it has no parameter `scale`" in got[0].message and "whose parameters" not in got[0].message


def test_calls_the_check_cannot_judge_are_left_alone(tmp_path):
    r, base = _repo(tmp_path)
    shadow = '''from engine.ops import rms_norm


def run(x, w, args, rms_norm=None):
    return rms_norm(x)


def splat(x, args, kw):
    from engine.ops import rms_norm as norm
    return norm(*args, **kw)


def control(x):
    return rms_norm(x)
'''
    head = r.commit_files({"engine/other.py": shadow}, "callers the check cannot judge")
    # only the control call, which nothing shadows, is judged
    assert [(f.locations[0].path, f.locations[0].line) for f in calls_found(audit(r.path, base, head))] == [
        ("engine/other.py", 14)]
    # a decorated callee (a decorator may change what the name takes) and a name bound twice are not judged; the
    # control beside them (a function-level import of an undecorated class) is
    deco = OPS.replace("def rms_norm(", "@register('rms')\ndef rms_norm(") + "\n\nfused_add = wrap(fused_add)\n"
    head = r.commit_files({"engine/ops.py": deco, "engine/other.py": None,
                           "engine/user.py": USER.replace("1e-5)", "1e-5, 4)")
                           + "\n\ndef f(x):\n    from engine.ops import fused_add\n    return fused_add(x)\n"
                           + "\n\ndef q():\n    from engine.ops import Quantizer\n    return Quantizer()\n"}, "deco")
    assert [(f.locations[0].path, f.locations[0].line) for f in calls_found(audit(r.path, base, head))] == [
        ("engine/user.py", 15)]


GUARD = '''import functools


def input_guard(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper


def register(name):
    def deco(fn):
        REGISTRY[name] = fn
        return lambda *a: fn(*a)
    return deco
'''

CHUNK = '''import torch

from engine import utils
from engine.utils import input_guard, register


@input_guard
@torch.compiler.disable
def chunk(q, k, v, scale=None):
    return q


@utils.input_guard
def fused(q, k):
    return q


@register("recurrent")
def recurrent(q, k):
    return q
'''


def test_a_function_behind_the_trees_own_wraps_decorator_is_judged(tmp_path):
    """A decorator of the tree built on functools.wraps (a guard, a profiler) keeps the signature it wraps; one that
    returns something else (a registry's lambda) may not, so its function is not judged."""
    r = GitRepo(tmp_path / "fla")
    base = r.commit_files({"engine/__init__.py": "", "engine/utils.py": GUARD, "engine/chunk.py": CHUNK,
                           "engine/layer.py": "from engine.chunk import chunk, fused, recurrent\n\n\n"
                                              "def f(q, k, v):\n    return chunk(q, k, v) + fused(q, k) + "
                                              "recurrent(q, k)\n"}, "ops")
    head = r.commit_files({"engine/layer.py": "from engine.chunk import chunk, fused, recurrent\n\n\n"
                                              "def f(q, k, v):\n    return chunk(q, k, v, head_first=False) + "
                                              "fused(q, k, v) + recurrent(q)\n"}, "stale arguments")
    got = sorted(f.message.split(": it ", 1)[1].split(".", 1)[0] for f in calls_found(audit(r.path, base, head)))
    assert got == ["has no parameter `head_first`", "takes at most 2 positional arguments, the call passes 3"], got


def test_a_misfit_the_base_already_had_is_not_this_prs(tmp_path):
    r = GitRepo(tmp_path / "old")
    bad = LAYERS.replace("rms_norm(x, w)", "rms_norm(x)")
    base = r.commit_files({"engine/__init__.py": "", "engine/ops.py": OPS, "engine/layers.py": bad}, "old misfit")
    head = r.commit_files({"engine/ops.py": OPS.replace("eps=1e-6", "eps=1e-5")}, "unrelated change")
    assert calls_found(audit(r.path, base, head)) == []
    # the PR changing the signature again keeps the old misfit the base's own; a new caller it adds is its own
    head2 = r.commit_files({"engine/ops.py": OPS.replace("weight, eps", "weight, bias, eps"),
                            "engine/new.py": "from engine.ops import fused_add\n\n\ndef g(x):\n    return fused_add(x)\n"},
                           "bias")
    assert [(f.locations[0].path, f.locations[0].line) for f in calls_found(audit(r.path, base, head2))] == [
        ("engine/new.py", 5)]


def test_a_copied_file_brings_its_own_misfits_without_a_finding(tmp_path):
    """A new backend that copies a module whole keeps the misfit calls the original had: not this PR's drift;
    a misfit the copy adds is."""
    r, base = _repo(tmp_path)
    old = LAYERS + "\n\ndef unused(x):\n    return rms_norm(x)\n"
    base = r.commit_files({"engine/layers.py": old}, "an unused misfit")
    head = r.commit_files({"backends/hpu/engine/layers.py": old + "\n\ndef more(x):\n    return fused_add(x)\n"},
                          "copy the layers for a backend")
    got = [(f.locations[0].path, f.locations[0].line) for f in calls_found(audit(r.path, base, head))]
    assert got == [("backends/hpu/engine/layers.py", 20)], got


def test_disable_turns_the_check_off(tmp_path):
    r, base = _repo(tmp_path)
    head = r.commit_files({"engine/ops.py": OPS.replace("weight, eps", "weight, bias, eps")}, "bias")
    co = checkout(AuditRequest(repo=str(r.path), base=base, head=head))
    on = run_checks(co, parse_config("[settings]\ninfer = true\n"), build_changeset(co))
    assert [f.rule for f in calls_found(on)] == [RULE_ID]
    off = run_checks(co, parse_config(f'[settings]\ninfer = true\ndisable = ["{RULE_ID}"]\n'), build_changeset(co))
    assert calls_found(off) == []


def test_signatures_read_from_python_source():
    mod = read_module("m.py", b'''import functools


def a(x, /, y, *args, z, w=1, **kw):
    pass


@functools.lru_cache(maxsize=None)
def b(p: int, q: "str" = "s"):
    pass


@some.registry
def c(x):
    pass


class D:
    @staticmethod
    def __new__(cls, n):
        pass

    def __init__(self, n):
        pass


@dataclass
class E:
    x: int


def f(x):
    pass


f = g
''')
    assert mod is not None
    assert set(mod.callables) == {"a", "b", "D", "D.__new__"}
    a = mod.callables["a"]
    assert [(p.name, p.kind, p.default) for p in a.params] == [
        ("x", "pos", False), ("y", "any", False), ("args", "star", True), ("z", "kw", False), ("w", "kw", True),
        ("kw", "starstar", True)]
    assert a.misfit(2, ("z",)) is None and a.misfit(5, ("z", "other")) is None
    assert a.misfit(2, ()) == "needs `z`, which the call does not pass"
    assert a.misfit(1, ("y", "z", "x")) is None  # x is positional-only: ``x=`` goes to **kw
    b: Sig = mod.callables["b"]
    assert b.misfit(3, ()) == "takes at most 2 positional arguments, the call passes 3"
    assert b.misfit(1, ("p",)) == "gets `p` both by position and by keyword"
    assert mod.callables["D"].label == "D.__init__" and mod.callables["D"].misfit(1, ()) is None
    assert a.render() == "(x, /, y, *args, z, w=…, **kw)" and b.render() == "(p, q=…)"
    assert read_module("k.py", b"def k(a, *, b, c=1):\n    pass\n").callables["k"].render() == "(a, *, b, c=…)"
    assert read_module("bin.py", b"\0\0\0binary") is None


def test_hostile_sources_are_skipped_not_fatal(tmp_path):
    """Invalid UTF-8, NUL bytes, nesting past Python's stack and broken syntax in the PR's files: the audit
    still judges the call that can be judged, and reports no failure of the check."""
    r, base = _repo(tmp_path)
    deep = "x = " + "(" * 3000 + "1" + ")" * 3000 + "\n"
    nested = "".join("    " * i + "if a:\n" for i in range(1200)) + "    " * 1200 + "rms_norm(1)\n"
    r.write("engine/latin1.py", b"from engine.ops import rms_norm\n# caf\xe9\nrms_norm(1)\n")
    r.write("engine/nul.py", b"from engine.ops import rms_norm\nrms_norm(1)\0\0\n")
    head = r.commit_files({"engine/deep.py": deep, "engine/nested.py": "from engine.ops import rms_norm\n" + nested,
                           "engine/broken.py": "from engine.ops import rms_norm\ndef f(:\n    rms_norm(1, 2\n"},
                          "hostile")
    found = audit(r.path, base, head)
    assert not [u for u in found.unchecked if "call fit" in u.entry], found.unchecked
    got = [(f.locations[0].path, f.locations[0].line) for f in calls_found(found)]
    assert ("engine/latin1.py", 3) in got and not any(p == "engine/nul.py" for p, _ in got), got


def test_imports_resolve_as_python_would_for_scripts_and_sub_projects(tmp_path):
    """A script's ``from utils import`` means the utils beside it; a sub-project's copy of a package importing
    itself means its own copy, not the top-level package of the same name."""
    from checks.infer.calls import Resolver
    from checks.workspace import Tree

    r = GitRepo(tmp_path / "m")
    sha = r.commit_files({"utils.py": "", "tools/bench/utils.py": "", "tools/bench/run.py": "from utils import f\n",
                          "pkg/__init__.py": "", "pkg/ops.py": "", "sft/pkg/__init__.py": "", "sft/pkg/ops.py": "",
                          "sft/pkg/layer.py": "", "pkg/layer.py": "", "lib/__init__.py": "", "lib/a.py": ""}, "tree")
    res = Resolver(Tree(str(r.path), sha))
    assert res.module_file("tools/bench/run.py", "utils") == "tools/bench/utils.py"
    assert res.module_file("lib/a.py", "utils") == "utils.py"  # inside a package: the absolute import
    assert res.module_file("sft/pkg/layer.py", "pkg.ops") == "sft/pkg/ops.py"
    assert res.module_file("pkg/layer.py", "pkg.ops") == "pkg/ops.py"
    assert res.module_file("pkg/layer.py", ".ops") == "pkg/ops.py"
    assert res.module_file("pkg/layer.py", "torch.nn") is None


def test_the_review_comment_shows_the_call_and_the_callee(tmp_path, capsys):
    from bot.cli import main

    r, base = _repo(tmp_path)
    r.commit_files({"engine/ops.py": OPS.replace("weight, eps", "weight, bias, eps")}, "bias")
    main(["review", str(r.path), "--base", base, "--head", "HEAD"])
    out = capsys.readouterr().out
    assert "**inferred-call-fit**" in out and "`engine/layers.py:7` — the call" in out, out
    assert "`engine/ops.py:4` — the callee" in out
    assert "Evidence (the callee's parameters)" in out
    assert "engine/ops.py:4 def rms\\_norm\\(x, weight, bias, eps=1e-6\\)" in out
