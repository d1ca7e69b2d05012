"""Registries and imports, name by name, on real git repos with no config.

A definition registered into a registry of the tree (``@MODELS.register_module()``, ``@register(Config)``)
changes that registry (and what reads it), not every name of its module; a library's registering decorator
still changes the whole module. A duplicate import removed, or a name added to ``from m import a``, changes
nothing else, and ``torch.nn.Linear`` reads no binding ``nn``.
"""

from __future__ import annotations

import pytest

from tests.selection.plans import selected_tests

BASE = {
    "eng/__init__.py": "",
    "eng/registry.py": "MODELS = {}\n\n\ndef register(name):\n    def wrap(cls):\n        MODELS[name] = cls\n"
                       "        return cls\n    return wrap\n\n\ndef build(name):\n    return MODELS[name]()\n\n\n"
                       "def unrelated():\n    return 0\n",
    "eng/models.py": "import torch\n\nfrom eng.registry import register\nfrom eng.util import helper\n\n\n"
                     "@register('llama')\nclass Llama(torch.nn.Module):\n    def forward(self, x):\n        return x + 1\n\n\n"
                     "def size():\n    return 7\n\n\nimport torch.nn as nn\n\n\ndef _unused(m: nn.Module):\n"
                     "    return m\n",
    "eng/lib_ops.py": "import torch\n\n\n@torch.library.custom_op('eng::add', mutates_args=())\ndef add(x):\n"
                      "    return x + 1\n\n\ndef other():\n    return 2\n",
    "eng/ops_a.py": "from eng.registry import register\n\n\n@register('a')\nclass OpA:\n    k = 1\n",
    "eng/ops_b.py": "from eng.registry import register\n\n\n@register('b')\nclass OpB:\n    k = 2\n",
    "tests/test_ops_all.py": "import eng.models\nimport eng.ops_a\nimport eng.ops_b\nfrom eng.registry import MODELS\n\n\n"
                             "def test_all():\n    assert set(MODELS) >= {'a', 'b'}\n",
    "tests/test_op_b.py": "from eng.ops_b import OpB\n\n\ndef test_b():\n    assert OpB.k == 2\n",
    "eng/quant/__init__.py": "",
    "eng/quant/handlers.py": "HANDLERS = {}\n\n\ndef register_handler(cfg):\n    def wrap(fn):\n"
                             "        HANDLERS[cfg] = fn\n        return fn\n    return wrap\n\n\n"
                             "def quantize(model, config):\n    return HANDLERS[type(config)](model, config)\n",
    "eng/quant/configs.py": "class AWQConfig:\n    pass\n\n\nclass FP8Config:\n    pass\n",
    "eng/quant/awq.py": "from eng.quant.configs import AWQConfig\nfrom eng.quant.handlers import register_handler\n\n\n"
                        "@register_handler(AWQConfig)\ndef _awq(model, config):\n    return model + 1\n",
    "eng/quant/fp8.py": "from eng.quant.configs import FP8Config\nfrom eng.quant.handlers import register_handler\n\n\n"
                        "@register_handler(FP8Config)\ndef _fp8(model, config):\n    return model + 2\n",
    "tests/test_awq.py": "import eng.quant.awq\nfrom eng.quant.configs import AWQConfig\nfrom eng.quant.handlers import quantize\n"
                         "\n\ndef test_a():\n    assert quantize(1, AWQConfig()) == 2\n",
    "tests/test_fp8.py": "import eng.quant.awq\nimport eng.quant.fp8\nfrom eng.quant.configs import FP8Config\n"
                         "from eng.quant.handlers import quantize\n\n\ndef test_f():\n    assert quantize(1, FP8Config()) == 3\n",
    "eng/libreg.py": "import torch\n\n\ndef register_op(name):\n    return torch.library.custom_op(name, mutates_args=())\n",
    "eng/custom.py": "from eng.libreg import register_op\n\n\n@register_op('eng::fused')\ndef fused(x):\n"
                    "    return x + 1\n\n\ndef plain():\n    return 3\n",
    "tests/test_fused_op.py": "import torch\nimport eng.custom\n\n\ndef test_f():\n    assert torch.ops.eng.fused(1)\n",
    "eng/util.py": "def helper():\n    return 1\n\n\ndef extra():\n    return 2\n",
    "tests/test_build.py": "import eng.models\nfrom eng.registry import build\n\n\ndef test_b():\n    assert build('llama')\n",
    "tests/test_size.py": "from eng.models import size\n\n\ndef test_s():\n    assert size() == 7\n",
    "tests/test_unrelated.py": "from eng.registry import unrelated\n\n\ndef test_u():\n    assert unrelated() == 0\n",
    "tests/test_ops.py": "import torch\nimport eng.lib_ops\n\n\ndef test_o():\n    assert torch.ops.eng.add(1)\n",
    "tests/test_other.py": "from eng.lib_ops import other\n\n\ndef test_x():\n    assert other() == 2\n",
}


@pytest.fixture
def repo(git_repo):
    git_repo.base = git_repo.commit_files(BASE, "base")
    return git_repo


def selected(repo, path, old, new):
    assert old in BASE[path]
    head = repo.commit_files({path: BASE[path].replace(old, new, 1)})
    return selected_tests(repo.path, repo.base, head)


def test_a_registered_model_reaches_the_registry_readers_not_its_module_neighbours(repo):
    # test_build reads the registry (build); test_size imports size from the same module, which did not change
    assert selected(repo, "eng/models.py", "return x + 1", "return x + 2") == ["tests/test_build.py",
                                                                              "tests/test_ops_all.py"]


def test_a_library_registry_still_changes_the_whole_module(repo):
    # torch.ops.eng.add is reached by name at run time: every importer of the module counts
    assert selected(repo, "eng/lib_ops.py", "return x + 1", "return x + 2") == ["tests/test_ops.py",
                                                                                "tests/test_other.py"]


def test_a_duplicate_import_removed_with_an_unused_helper_selects_nothing(repo):
    old = "\n\nimport torch.nn as nn\n\n\ndef _unused(m: nn.Module):\n    return m\n"
    assert selected(repo, "eng/models.py", old, "\n") == []


def test_a_name_added_to_an_import_leaves_the_others_alone(repo):
    assert selected(repo, "eng/models.py", "from eng.util import helper", "from eng.util import extra, helper") == []


def test_registering_through_a_function_does_not_change_its_other_users(repo):
    # ops_b registers through the same register(); OpA changing fills the table, it does not change OpB
    got = selected(repo, "eng/ops_a.py", "k = 1", "k = 3")
    assert "tests/test_ops_all.py" in got and "tests/test_op_b.py" not in got


def test_a_handler_registered_for_a_class_reaches_the_tests_that_name_it(repo):
    # both tests import the AWQ module and call quantize(); only test_awq makes an AWQConfig
    assert selected(repo, "eng/quant/awq.py", "model + 1", "model + 5") == ["tests/test_awq.py"]


def test_a_tree_function_that_forwards_to_a_library_registry_keeps_the_module_whole(repo):
    # register_op fills no table of the tree (torch.library does): the op is reached by name at run time
    assert selected(repo, "eng/custom.py", "x + 1", "x + 2") == ["tests/test_fused_op.py"]
