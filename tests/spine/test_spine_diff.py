"""ChangeSet from real git ranges: every kind of file change the diff must survive."""

from checks.diff import build_changeset
from checks.model import AuditRequest, ChangeSet, from_json, to_json
from checks.workspace import checkout


def changes(repo, base, head="HEAD") -> ChangeSet:
    return build_changeset(checkout(AuditRequest(repo=str(repo.root), base=base, head=head)))


def test_added_modified_deleted_renamed_binary_mode(repo):
    repo.write("engine/model.py", "def forward(x):\n    return x\n")
    repo.write("csrc/attn.cu", "__global__ void attn(float* o) {\n  o[0] = 1;\n}\n")
    repo.write("old/name.h", "#pragma once\nint task_count();\n" + "// pad\n" * 20)
    repo.write("gone.cc", "int gone() { return 0; }\n")
    repo.write("assets/w.bin", bytes(range(256)) * 4)
    repo.write("run.sh", "echo hi\n")
    base = repo.commit("base")
    repo.write("engine/model.py", "def forward(x):\n    y = x * 2\n    return y\n")
    repo.write("csrc/new_kernel.cuh", "#pragma once\n__device__ int lane() { return 0; }\n")
    repo.mv("old/name.h", "include/name.h")
    repo.rm("gone.cc")
    repo.write("assets/w.bin", bytes(range(255, -1, -1)) * 4)
    repo.chmod_x("run.sh")
    repo.commit("head")

    cs = changes(repo, base)
    by = {f.path: f for f in cs.files}
    assert by["engine/model.py"].status == "modified"
    h = by["engine/model.py"].hunks
    assert len(h) == 1 and h[0].added == [2, 3] and h[0].removed == [2]
    assert (h[0].old_start, h[0].new_start) == (2, 2)
    assert by["csrc/new_kernel.cuh"].status == "added" and by["csrc/new_kernel.cuh"].additions == 2
    assert by["include/name.h"].status == "renamed" and by["include/name.h"].old_path == "old/name.h"
    assert by["include/name.h"].hunks == []
    assert by["gone.cc"].status == "deleted" and by["gone.cc"].deletions == 1 and by["gone.cc"].new_blob is None
    assert by["assets/w.bin"].binary and by["assets/w.bin"].hunks == []
    assert by["run.sh"].mode_changed and by["run.sh"].new_mode == "100755"
    assert all(f.new_blob is None or len(f.new_blob) == 40 for f in cs.files)


def test_non_utf8_content_keeps_line_numbers(repo):
    repo.write("legacy.py", b"# caf\xe9\nx = 1\n")
    base = repo.commit("base")
    repo.write("legacy.py", b"# caf\xe9\nx = 2\n# na\xefve \xff\xfe\n")
    repo.commit("head")
    f = changes(repo, base).files[0]
    assert f.path == "legacy.py" and not f.binary
    assert f.hunks[0].added == [2, 3] and f.hunks[0].removed == [2]


def test_utf8_path_names_survive(repo):
    repo.write("docs/ünïcode name.py", "a = 1\n")
    base = repo.commit("base")
    repo.write("docs/ünïcode name.py", "a = 2\n")
    repo.commit("head")
    f = changes(repo, base).files[0]
    assert f.path == "docs/ünïcode name.py" and f.hunks[0].added == [1]


def test_empty_diff(repo):
    repo.write("a.py", "x = 1\n")
    sha = repo.commit("only")
    repo.commit("empty")
    cs = changes(repo, sha)
    assert cs.files == [] and cs.head_sha != cs.base_sha


def test_merge_base_like_git_diff_merge_base(repo):
    repo.write("a.py", "x = 1\n")
    root = repo.commit("root")
    repo.git("checkout", "-q", "-b", "feature")
    repo.write("feature.py", "f = 1\n")
    head = repo.commit("feature work")
    repo.git("checkout", "-q", "main")
    repo.write("main_only.py", "m = 1\n")
    main = repo.commit("main moved on")
    cs = changes(repo, main, head)
    assert cs.merge_base_sha == root
    assert [f.path for f in cs.files] == ["feature.py"]  # main's own change is not part of the PR


def test_hundred_thousand_line_diff(repo):
    repo.write("big.py", "x = 0\n")
    base = repo.commit("base")
    repo.write("big.py", "".join(f"v{i} = {i}\n" for i in range(100_000)))
    repo.commit("head")
    f = changes(repo, base).files[0]
    assert f.additions == 100_000 and f.deletions == 1


def test_changeset_round_trips_through_json(repo):
    repo.write("a.py", "x = 1\n")
    base = repo.commit("base")
    repo.write("a.py", "x = 2\n")
    repo.mv("a.py", "b.py")
    repo.commit("head")
    cs = changes(repo, base)
    assert from_json(ChangeSet, to_json(cs)) == cs
