"""Blob reads from several threads at once, as the bot's worker pool does them."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from checks.workspace import _repo, close_repos, read_blob
from tests.gitrepo import GitRepo


def test_each_thread_gets_its_own_repo_and_one_thread_reuses_its_own(tmp_path):
    repo = GitRepo(tmp_path / "r")
    repo.commit_files({"a.txt": "a\n"})
    path = str(repo.path)
    here = _repo(path)
    assert _repo(path) is here
    seen: list[object] = []
    t = threading.Thread(target=lambda: seen.append(_repo(path)))
    t.start()
    t.join()
    assert seen and seen[0] is not here  # a Repo's cat-file pipes are never shared across threads
    close_repos()
    assert _repo(path) is not here  # closed repos are opened again on the next read


def test_concurrent_blob_reads_return_each_blob_whole(tmp_path):
    repo = GitRepo(tmp_path / "r")
    files = {f"f{i}.txt": f"{i}\n" * (200 + 37 * i) for i in range(48)}
    repo.commit_files(files)
    path = str(repo.path)
    blobs = {p: repo.git("rev-parse", f"HEAD:{p}").strip() for p in files}

    def read_all(k: int) -> list[bool]:
        ok = []
        for _ in range(3):
            read_blob.cache_clear()  # every read goes to git, not the cache
            for p in list(files)[k % 4::2]:
                ok.append(read_blob(path, blobs[p]) == files[p].encode())
        return ok

    with ThreadPoolExecutor(8) as pool:
        results = [ok for chunk in pool.map(read_all, range(16), timeout=120) for ok in chunk]
    assert results and all(results)
