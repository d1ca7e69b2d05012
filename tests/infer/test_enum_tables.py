"""A table keyed by an enum's members (``{QuantMethod.AWQ: AWQConfig}``) holds them by name, the class dropped."""

from __future__ import annotations

from tests.gitrepo import GitRepo
from tests.infer.audits import audit, inferred

METHODS = ["AWQ", "GPTQ", "FP8", "INT8", "MXFP4"]


def enum(members: list[str]) -> str:
    return "import enum\n\n\nclass QuantMethod(enum.Enum):\n" + "".join(f"    {m} = {m.lower()!r}\n" for m in members)


def table(members: list[str]) -> str:
    rows = "".join(f"    QuantMethod.{m}: {m.title()}Config,\n" for m in members)
    return f"from .types import QuantMethod\nfrom .configs import *  # noqa\n\nCONFIGS = {{\n{rows}}}\n"


def test_an_enum_member_its_complete_table_lacks_is_caught(tmp_path):
    r = GitRepo(tmp_path / "quant")
    base = r.commit_files({"quant/types.py": enum(METHODS), "quant/registry.py": table(METHODS)}, "quant methods")
    head = r.commit_files({"quant/types.py": enum([*METHODS, "NVFP4"])}, "nvfp4")
    new = inferred(audit(r.path, base, head))
    assert len(new) == 1, [f.message for f in new]
    assert new[0].message.startswith("`NVFP4` is in enum class QuantMethod (quant/types.py:"), new[0].message
    assert "missing from dict keys of CONFIGS (quant/registry.py:" in new[0].message, new[0].message


def test_a_partial_table_or_keys_of_several_classes_hold_no_belief(tmp_path):
    r = GitRepo(tmp_path / "quant")
    mixed = table(METHODS).replace("CONFIGS = {\n", "CONFIGS = {\n    torch.float16: HalfConfig,\n")
    base = r.commit_files({"quant/types.py": enum(METHODS), "quant/registry.py": table(METHODS[:4]),
                           "quant/mixed.py": mixed}, "a partial table")
    head = r.commit_files({"quant/types.py": enum([*METHODS, "NVFP4"])}, "nvfp4")
    assert inferred(audit(r.path, base, head)) == []
    # Tables keyed by a module's attributes (torch dtypes) in two files: no enum of this tree says what they hold.
    dtypes = ["float16", "bfloat16", "float32", "int8", "uint8"]

    def dmap(name: str, keys: list[str]) -> str:
        return "import torch\n\n" + f"{name} = {{\n" + "".join(f"    torch.{k}: {k!r},\n" for k in keys) + "}\n"

    first = r.commit_files({"quant/a.py": dmap("DTYPE_BITS", dtypes), "quant/b.py": dmap("DTYPE_NAMES", dtypes)}, "maps")
    grown = r.commit_files({"quant/a.py": dmap("DTYPE_BITS", [*dtypes, "float8_e4m3fn"])}, "fp8 bits")
    assert inferred(audit(r.path, first, grown)) == []


MODELS = ["chatglm", "gemma", "gemma2", "llama", "mistral", "phi3", "qwen2", "qwen3"]


def cpp_models(models: list[str]) -> str:
    rows = ", ".join(f'"{m}"' for m in models)
    return ("#include <array>\n#include <string_view>\n\nbool IsLLM(const std::string& model_type) {\n"
            f"  static constexpr std::array<std::string_view, {len(models)}> LLM = {{{rows}}};\n"
            "  return std::find(LLM.begin(), LLM.end(), model_type) != LLM.end();\n}\n")


def builder(models: list[str]) -> str:
    return "SUPPORTED = [\n" + "".join(f"    {m!r},\n" for m in models) + "]\n"


def test_a_cpp_initializer_list_is_a_table_too(tmp_path):
    # The runtime's list of model types (a local lookup table in C++) and the exporter's list agree.
    r = GitRepo(tmp_path / "genai")
    base = r.commit_files({"src/models/model_type.h": cpp_models(MODELS), "py/builder.py": builder(MODELS)}, "types")
    head = r.commit_files({"py/builder.py": builder([*MODELS, "smollm3"])}, "export smollm3")
    new = inferred(audit(r.path, base, head))
    assert len(new) == 1 and new[0].message.startswith("'smollm3' is in list SUPPORTED (py/builder.py:"), [
        f.message for f in new]
    assert "missing from table LLM (src/models/model_type.h:" in new[0].message, new[0].message
