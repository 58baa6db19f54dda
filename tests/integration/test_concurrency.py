"""Many simultaneous creates and deletes, in shared and separate quota scopes."""

import threading
from concurrent.futures import ThreadPoolExecutor

from conftest import new_qsid, new_vfid

N = 50


def run_all(fn, items):
    """Calls fn(item) for every item at once (threads released together by a barrier)."""
    barrier = threading.Barrier(len(items))

    def call(item):
        barrier.wait(timeout=30)
        return fn(item)

    with ThreadPoolExecutor(max_workers=len(items)) as pool:
        return list(pool.map(call, items))


def test_concurrent_create_and_delete(daemon):
    shared = new_qsid()
    vfids = [new_vfid(shared) for _ in range(N // 2)] + [new_vfid() for _ in range(N - N // 2)]

    created = run_all(
        lambda v: daemon.mgr("POST", "/folder/create", json={"volume": "local", "vfid": v}), vfids
    )
    assert [r.status_code for r in created] == [204] * N, [r.text for r in created]
    for v in vfids:
        assert daemon.vfolder_path(v).is_dir(), v

    deleted = run_all(
        lambda v: daemon.mgr("POST", "/folder/delete", json={"volume": "local", "vfid": v}), vfids
    )
    assert [r.status_code for r in deleted] == [202] * N, [r.text for r in deleted]
    task_ids = [r.json()["bgtask_id"] for r in deleted]
    assert len(set(task_ids)) == N
    for t in task_ids:
        task = daemon.wait_task(t)
        assert task["status"] == "completed", task
    for v in vfids:
        assert not daemon.vfolder_path(v).exists(), v
    # The shared scope is empty again and can go.
    r = daemon.mgr("DELETE", "/quota-scope", json={"volume": "local", "qsid": shared})
    assert r.status_code == 204, r.text
