"""Kernels defined inside module-level ``if``/``try`` blocks, on real git repos with no config.

Kernel modules often read ``if triton.__version__ >= …: def …`` / ``else: raise …`` and ``try: from
flash_attn_interface import …; def v3_fwd(…) / except ImportError: print(…)``. A line inside one of those
``def``s changes that name alone (its callers follow by name); the condition or the ``except`` clause
changes all the block binds.
"""

from __future__ import annotations

import pytest

from tests.selection.plans import selected_tests

KERNEL = '''import triton

if triton.__version__ >= "2.1.0":

    @triton.jit
    def _fwd_kernel(Q, Out):
        pass

    def triton_fwd(q, o):
        _fwd_kernel[(1,)](q, o)

else:
    raise Exception("error triton version!")

_v3 = False
try:
    from flash_attn_interface import _flash_attn_forward

    _v3 = True

    def v3_fwd(q, o):
        scale = q.shape[-1] ** -0.5
        _flash_attn_forward(q, o, scale)

except ImportError:
    print("no flash_attn_interface")
    _v3 = False


def attention_fwd(q, o):
    if _v3:
        v3_fwd(q, o)
    else:
        triton_fwd(q, o)
'''

BASE = {
    "lib/__init__.py": "",
    "lib/models/__init__.py": "",
    "lib/models/vit/__init__.py": "",
    "lib/models/vit/kernel/__init__.py": "",
    "lib/models/vit/kernel/attn.py": KERNEL,
    "lib/models/vit/layer.py": "from lib.models.vit.kernel.attn import triton_fwd\n\n\ndef layer(q, o):\n"
                               "    return triton_fwd(q, o)\n",
    "unit_tests/models/vit/test_attention_fwd.py": "from lib.models.vit.kernel.attn import attention_fwd\n\n\n"
                                                   "def test_fwd():\n    attention_fwd(1, 2)\n",
    "unit_tests/models/vit/test_layer.py": "from lib.models.vit.layer import layer\n\n\n"
                                           "def test_layer():\n    layer(1, 2)\n",
}


@pytest.fixture
def repo(git_repo):
    git_repo.base = git_repo.commit_files(BASE, "base")
    return git_repo


def selected(repo, old: str, new: str) -> list[str]:
    assert old in KERNEL
    head = repo.commit_files({"lib/models/vit/kernel/attn.py": KERNEL.replace(old, new, 1)})
    return selected_tests(repo.path, repo.base, head)


def test_a_def_inside_try_reaches_its_callers_tests_only(repo):
    # the kernel's own test imports attention_fwd, which calls v3_fwd; the layer test uses triton_fwd only
    assert selected(repo, "** -0.5", "** (-0.5)") == ["unit_tests/models/vit/test_attention_fwd.py"]


def test_a_def_inside_if_with_a_raising_else_is_by_name(repo):
    assert selected(repo, "_fwd_kernel[(1,)](q, o)", "_fwd_kernel[(2,)](q, o)") == [
        "unit_tests/models/vit/test_attention_fwd.py", "unit_tests/models/vit/test_layer.py"]


def test_the_except_clause_changes_the_whole_block(repo):
    # what runs when the import fails is the block's effect: every importer of the module may see it
    assert selected(repo, 'print("no flash_attn_interface")', 'print("flash_attn_interface missing")') == [
        "unit_tests/models/vit/test_attention_fwd.py", "unit_tests/models/vit/test_layer.py"]


def test_the_condition_changes_every_name_the_block_binds(repo):
    assert selected(repo, '>= "2.1.0"', '>= "3.0.0"') == [
        "unit_tests/models/vit/test_attention_fwd.py", "unit_tests/models/vit/test_layer.py"]
