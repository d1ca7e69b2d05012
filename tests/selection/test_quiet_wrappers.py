"""Decorators that wrap, library registries and lazy re-exports, name by name, on real git repos with no config.

A decorator of the tree that only wraps (``@dispatch("op")``, a factory returning ``functools.wraps`` wrappers,
or ``@guard`` used bare) registers nothing: a changed definition under it changes its own name, not the
decorator and its other users. So does a library decorator named like no registration (``@torch.compiler.disable``,
``@can_return_tuple``). ``AutoModel.register(Cfg, Model)`` binds its arguments (only code naming them looks
the model up); a lazy ``__getattr__`` that imports a module by name re-exports the names it spells;
``__all__.extend([...])`` rebinds ``__all__``; a new module without import-time effects brings its importers
only its names; ``from .ops import *`` brings the public changed names; ``if Op.ok(): register_fusion(fuse)``
fills the tree's table like a decorator would, and has no other effect. A definition a library registers
under a name (``@torch.library.impl("pk::attention_fwd", "CUDA")``) reaches the code spelling that name.
"""

from __future__ import annotations

import pytest

from tests.selection.plans import selected_tests

BASE = {
    "pkg/__init__.py": "",
    "pkg/backends.py": "import functools\n\n_LOG = set()\n\n\ndef dispatch(op):\n    def decorator(fn):\n"
                       "        @functools.wraps(fn)\n        def wrapper(*a):\n            _LOG.add(op)\n"
                       "            return fn(*a)\n        return wrapper\n    return decorator\n\n\n"
                       "def guard(fn=None, *, strict=False):\n    def decorator(fn):\n        @functools.wraps(fn)\n"
                       "        def wrapper(*a):\n            return fn(*a)\n        return wrapper\n"
                       "    if fn is not None:\n        return decorator(fn)\n    return decorator\n",
    "pkg/ops.py": "import torch\nfrom transformers.utils import can_return_tuple\n\n"
                  "from pkg.backends import dispatch, guard\n\n\n"
                  "def kernel_a(x):\n    return x + 1\n\n\n@dispatch('a')\ndef op_a(x):\n    return kernel_a(x)\n\n\n"
                  "@dispatch('b')\n@guard\ndef op_b(x):\n    return x * 2\n\n\n@torch.compiler.disable\n"
                  "def op_c(x):\n    return x - 1\n\n\n@can_return_tuple\ndef op_d(x):\n    return x\n",
    "tests/test_a.py": "from pkg.ops import op_a\n\n\ndef test_a():\n    assert op_a(1) == 2\n",
    "tests/test_b.py": "from pkg.ops import op_b\n\n\ndef test_b():\n    assert op_b(1) == 2\n",
    "tests/test_c.py": "from pkg.ops import op_c\n\n\ndef test_c():\n    assert op_c(1) == 0\n",
    "tests/test_d.py": "from pkg.ops import op_d\n\n\ndef test_d():\n    assert op_d(1) == 1\n",
    "pkg/models/__init__.py": "from pkg.models.alpha import AlphaConfig, AlphaModel\n"
                              "from pkg.models.beta import BetaConfig, BetaModel\n\n"
                              "__all__ = ['AlphaConfig', 'AlphaModel', 'BetaConfig', 'BetaModel']\n"
                              "__all__.extend(['EXTRA'])\n",
    "pkg/models/alpha.py": "from transformers import AutoModel\n\n\nclass AlphaConfig:\n    pass\n\n\n"
                           "class AlphaModel:\n    def forward(self, x):\n        return x + 1\n\n\n"
                           "AutoModel.register(AlphaConfig, AlphaModel, exist_ok=True)\n",
    "pkg/models/beta.py": "from transformers import AutoModel\n\n\nclass BetaConfig:\n    pass\n\n\n"
                          "class BetaModel:\n    def forward(self, x):\n        return x + 2\n\n\n"
                          "AutoModel.register(BetaConfig, BetaModel, exist_ok=True)\n",
    "tests/test_alpha.py": "from transformers import AutoModel\n\nfrom pkg.models import AlphaConfig\n\n\n"
                           "def test_alpha():\n    assert AutoModel.from_config(AlphaConfig())\n",
    "tests/test_beta.py": "from transformers import AutoModel\n\nfrom pkg.models import BetaConfig\n\n\n"
                          "def test_beta():\n    assert AutoModel.from_config(BetaConfig())\n",
    "pkg/lazy.py": "import importlib\n\nfrom pkg.ops import op_a\n\n\ndef __getattr__(name):\n"
                   "    if name in {'op_c'}:\n        return getattr(importlib.import_module('pkg.ops'), name)\n"
                   "    raise AttributeError(name)\n",
    "tests/test_lazy.py": "from pkg.lazy import op_c\n\n\ndef test_lazy():\n    assert op_c(1) == 0\n",
    "pkg/api.py": "from pkg.ops import *\n",
    "tests/test_api.py": "from pkg.api import op_b\n\n\ndef test_api():\n    assert op_b(1) == 2\n",
    "pkg/fuser.py": "FUSIONS = []\n\n\ndef register_fusion(fn):\n    FUSIONS.append(fn)\n\n\n"
                    "def fuse(ops):\n    return [f(ops) for f in FUSIONS]\n\n\ndef unrelated():\n    return 0\n",
    "pkg/fused.py": "from pkg.fuser import register_fusion\n\n\nclass Op:\n    @staticmethod\n    def ok():\n"
                    "        return True\n\n\ndef fuse_mlp(ops):\n    return ops\n\n\ndef helper():\n    return 1\n\n\n"
                    "if Op.ok():\n    register_fusion(fuse_mlp)\n",
    "tests/test_fuse.py": "import pkg.fused\nfrom pkg.fuser import fuse\n\n\ndef test_f():\n    assert fuse([1]) == [[1]]\n",
    "tests/test_unrelated.py": "from pkg.fuser import unrelated\n\n\ndef test_u():\n    assert unrelated() == 0\n",
    "tests/test_helper.py": "from pkg.fused import helper\n\n\ndef test_h():\n    assert helper() == 1\n",
    "pkg/fmha.py": "import torch\n\n\ndef attention(q):\n    return q\n\n\n"
                   "@torch.library.impl('pk::attention_fwd', 'CUDA')\ndef attention_fwd_cuda(q):\n    return attention(q)\n"
                   "\n\ndef other_fmha():\n    return 2\n",
    "tests/test_op.py": "import torch\n\nimport pkg.fmha\n\n\ndef test_op():\n"
                        "    assert torch.ops.pk.attention_fwd(1) == 1\n",
    "pkg/tables.py": "def build(g):\n    return g\n\n\nTABLE = {}\nfor g in [1, 2]:\n    TABLE[g] = build(g)\n\n\n"
                     "def unrelated_table():\n    return 0\n",
    "tests/test_table.py": "from pkg.tables import TABLE\n\n\ndef test_t():\n    assert TABLE[1] == 1\n",
    "tests/test_table_other.py": "from pkg.tables import unrelated_table\n\n\ndef test_u():\n"
                                 "    assert unrelated_table() == 0\n",
    "tests/test_fmha_other.py": "from pkg.fmha import other_fmha\n\n\ndef test_o():\n    assert other_fmha() == 2\n",
}


@pytest.fixture
def repo(git_repo):
    git_repo.base = git_repo.commit_files(BASE, "base")
    return git_repo


def selected(repo, files):
    head = repo.commit_files(files)
    return selected_tests(repo.path, repo.base, head)


def edit(path, old, new):
    assert old in BASE[path]
    return {path: BASE[path].replace(old, new, 1)}


def test_a_kernel_under_a_wrapping_factory_decorator_reaches_only_its_users(repo):
    # op_a is wrapped by @dispatch('a'): op_b (also dispatched) and the other ops do not change
    assert selected(repo, edit("pkg/ops.py", "return x + 1", "return x + 3")) == ["tests/test_a.py"]


def test_a_bare_and_a_factory_wrapper_together_change_one_name(repo):
    assert selected(repo, edit("pkg/ops.py", "return x * 2", "return x * 3")) == ["tests/test_api.py",
                                                                                 "tests/test_b.py"]


def test_library_decorators_named_like_no_registration_only_wrap(repo):
    # op_c is also re-exported lazily by pkg/lazy.py's __getattr__ (import_module('pkg.ops'))
    assert selected(repo, edit("pkg/ops.py", "return x - 1", "return x - 2")) == ["tests/test_c.py",
                                                                                  "tests/test_lazy.py"]
    assert selected(repo, edit("pkg/ops.py", "def op_d(x):\n    return x\n",
                               "def op_d(x):\n    return x + 0\n")) == ["tests/test_d.py"]


def test_a_registering_factory_still_changes_its_table(repo):
    # a decorator that stores what it decorates is no wrapper: test_b (op_b) no longer, but the table does
    files = edit("pkg/backends.py", "            _LOG.add(op)\n            return fn(*a)\n        return wrapper\n",
                 "            return fn(*a)\n        _LOG.add(fn)\n        return wrapper\n")
    files.update(edit("pkg/ops.py", "return x + 1", "return x + 3"))
    got = selected(repo, files)
    assert {"tests/test_a.py", "tests/test_b.py"} <= set(got)


def test_a_model_registered_into_a_library_registry_reaches_only_tests_naming_it(repo):
    assert selected(repo, edit("pkg/models/alpha.py", "return x + 1", "return x + 5")) == ["tests/test_alpha.py"]


def test_a_new_module_without_effects_reaches_only_its_importers(repo):
    files = {"pkg/models/gamma.py": "class GammaConfig:\n    pass\n",
             "pkg/models/__init__.py": BASE["pkg/models/__init__.py"].replace(
                 "from pkg.models.beta", "from pkg.models.gamma import GammaConfig\nfrom pkg.models.beta", 1)
             .replace("'BetaModel']", "'BetaModel', 'GammaConfig']", 1),
             "tests/test_gamma.py": "from pkg.models import GammaConfig\n\n\ndef test_g():\n    assert GammaConfig\n"}
    assert selected(repo, files) == ["tests/test_gamma.py"]


def test_a_new_module_with_import_time_effects_still_reaches_every_importer(repo):
    files = {"pkg/models/gamma.py": "import os\n\nos.environ['X'] = '1'\n\n\nclass GammaConfig:\n    pass\n",
             "pkg/models/__init__.py": "from pkg.models.gamma import GammaConfig\n" + BASE["pkg/models/__init__.py"]}
    assert selected(repo, files) == ["tests/test_alpha.py", "tests/test_beta.py"]


def test_a_star_import_brings_the_changed_public_names(repo):
    # test_api takes op_b through pkg/api.py's "from pkg.ops import *": an edit of op_b reaches it (see above),
    # one of op_c does not
    assert selected(repo, edit("pkg/ops.py", "return x - 1", "return x - 3")) == ["tests/test_c.py",
                                                                                 "tests/test_lazy.py"]


def test_a_fusion_registered_by_a_call_reaches_the_table_readers_not_its_module(repo):
    # fuse reads the table register_fusion fills; helper (same module) and unrelated (same registry module) do not
    assert selected(repo, edit("pkg/fused.py", "    return ops\n", "    return ops[:1]\n")) == ["tests/test_fuse.py"]
    assert selected(repo, edit("pkg/fused.py", "        return True", "        return False")) == ["tests/test_fuse.py"]


def test_an_op_a_library_registers_by_name_reaches_the_code_spelling_it(repo):
    got = selected(repo, edit("pkg/fmha.py", "def attention(q):\n    return q\n", "def attention(q):\n    return q * 1\n"))
    assert got == ["tests/test_op.py"]


def test_a_module_level_loop_filling_a_table_binds_the_table(repo):
    assert selected(repo, edit("pkg/tables.py", "    return g\n", "    return g + 0\n")) == ["tests/test_table.py"]
