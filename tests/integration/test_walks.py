"""Tree walks (clone, usage, delete, archive) go by descriptor: racing symlink swaps cannot lead
them out of a vfolder, and trees deeper than PATH_MAX or than the descriptor limit work."""

import os
import shutil
import subprocess
import threading
import time

import pytest

from conftest import fd_limit, new_qsid, new_vfid, rss_kib
from test_upload import new_session, patch

DEPTH = 10000


def make_chain(root, depth, leaf=b"bottom"):
    """root/d/d/.../d/leaf, `depth` directories deep, built by descriptor (the path is far past
    PATH_MAX)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            nfd = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        lf = os.open("leaf", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd)
        os.write(lf, leaf)
        os.close(lf)
    finally:
        os.close(fd)


def chain_depth(root):
    """How deep root/d/d/... goes, and the leaf's content at the bottom."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    n = 0
    try:
        while True:
            try:
                nfd = os.open("d", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                break
            os.close(fd)
            fd = nfd
            n += 1
        lf = os.open("leaf", os.O_RDONLY, dir_fd=fd)
        data = os.read(lf, 100)
        os.close(lf)
        return n, data
    finally:
        os.close(fd)


def test_clone_under_racing_symlink_swaps(daemon, tmp_path):
    """Swapping a directory for a symlink while a clone ran put an outside file into 361 of 400
    cloned directories, and the task said "completed"."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"outside the vfolder")
    src = daemon.create_vfolder()
    root = daemon.vfolder_path(src)
    for i in range(400):
        (root / f"d{i}" / "sub").mkdir(parents=True)
        (root / f"d{i}" / "sub" / "own").write_bytes(b"own")
    stop = threading.Event()

    def swapper():
        i = 0
        while not stop.is_set():
            d = root / f"d{i % 400}" / "sub"
            try:
                d.rename(d.with_name("sub.away"))
                d.symlink_to(outside)
                time.sleep(0)
                d.unlink()
                d.with_name("sub.away").rename(d)
            except OSError:
                pass
            i += 1

    t = threading.Thread(target=swapper)
    t.start()
    try:
        results = []
        for _ in range(3):
            dst = new_vfid()
            r = daemon.mgr("POST", "/folder/clone", json={
                "src_volume": "local", "src_vfid": src, "dst_volume": "local", "dst_vfid": dst})
            assert r.status_code == 200, r.text
            task = daemon.wait_task(r.json()["bgtask_id"], timeout=120)
            results.append(task["status"])
            if task["status"] == "completed":
                clone = daemon.vfolder_path(dst)
                leaked = [p for p in clone.rglob("secret")]
                assert not leaked, f"outside files in the clone: {leaked[:5]}"
                for p in clone.rglob("*"):
                    if p.is_symlink():
                        assert os.readlink(p) == str(outside)  # copied as the link it was
    finally:
        stop.set()
        t.join()
    assert set(results) <= {"completed", "failed"}
    assert "completed" in results, results  # the leak check above ran on at least one clone


def test_deep_tree_under_a_low_descriptor_limit(make_daemon):
    """A tree 10,000 levels deep (20,000 bytes of path) under `ulimit -n 256`: usage, clone,
    uploads into its scope and deletes all work; before, they failed with ENAMETOOLONG or
    EMFILE (or a worker's stack overflowed), for the whole quota scope."""
    d = make_daemon(start_kw={"preexec_fn": fd_limit(256)})
    qsid = new_qsid()
    vfid = d.create_vfolder(new_vfid(qsid))
    dst = new_vfid(qsid)
    try:
        make_chain(d.vfolder_path(vfid), DEPTH)

        r = d.mgr("GET", "/folder/usage", json={"volume": "local", "vfid": vfid, "fresh": True})
        assert r.status_code == 200, r.text
        assert r.json()["file_count"] == DEPTH + 1
        assert r.json()["used_bytes"] == len(b"bottom")

        # Uploads into the same scope check its usage first.
        token = new_session(d, vfid, "up.bin", 4)
        assert patch(d, token, 0, b"abcd").status_code == 204

        r = d.mgr("POST", "/folder/clone", json={
            "src_volume": "local", "src_vfid": vfid, "dst_volume": "local", "dst_vfid": dst})
        assert r.status_code == 200, r.text
        task = d.wait_task(r.json()["bgtask_id"], timeout=300)
        assert task["status"] == "completed", task
        assert chain_depth(d.vfolder_path(dst)) == (DEPTH, b"bottom")

        r = d.mgr("POST", "/folder/file/delete",
                  json={"volume": "local", "vfid": dst, "relpaths": ["d"], "recursive": True})
        assert r.status_code in (200, 204), r.text
        assert not (d.vfolder_path(dst) / "d").exists()
        for v in (vfid, dst):
            assert d.delete_vfolder(v)["status"] == "completed"
            assert not d.vfolder_path(v).exists()
        assert d.proc.poll() is None
    finally:
        # Python's rmtree recurses per level: a chain left by a failure goes with rm.
        for v in (vfid, dst):
            subprocess.run(["rm", "-rf", str(d.vfolder_path(v))], check=False)


def test_a_delete_of_many_paths_under_a_low_descriptor_limit(make_daemon):
    """2,000 paths in one delete under `ulimit -n 256`: every one is checked before any goes,
    and the batch holds a couple of descriptors at a time (it held one per path, so such a
    request failed with EMFILE, and took every other request's descriptors while it ran)."""
    d = make_daemon(start_kw={"preexec_fn": fd_limit(256)})
    vfid = d.create_vfolder(new_vfid())
    root = d.vfolder_path(vfid)
    names = [f"d{i % 10}/f{i:04d}" for i in range(2000)]
    for n in names:
        (root / n).parent.mkdir(exist_ok=True)
        (root / n).write_bytes(b"x")
    body = {"volume": "local", "vfid": vfid, "relpaths": names + ["missing"]}
    r = d.mgr("POST", "/folder/file/delete", json=body)
    # Checked first (the contract's 400 "File not found"): nothing deleted.
    assert r.status_code == 400 and r.json()["errno"] == 2, r.text[:300]
    assert sum(1 for n in names if (root / n).exists()) == len(names)
    body["relpaths"] = names
    r = d.mgr("POST", "/folder/file/delete", json=body)
    assert r.status_code in (200, 204), r.text[:300]
    assert not any((root / n).exists() for n in names)
    assert d.proc.poll() is None


def test_trash_that_cannot_be_emptied_is_not_fatal(make_daemon, tmp_path):
    """A vfolder left in the trash by a crash, which cannot be removed (a mount point inside
    it here): the daemon starts anyway, says why, and empties it once it can."""
    d0 = make_daemon(storage_proxy={"session-expire": "4s"})  # janitor rounds every second
    vol = d0.vol
    d0.stop()
    stuck = vol / ".sluice-trash" / ("a" * 32 + "-00000000")
    (stuck / "deep").mkdir(parents=True)
    make_chain(stuck, 300)
    (tmp_path / "empty").mkdir()
    subprocess.run(["mount", "--bind", str(tmp_path / "empty"), str(stuck / "deep")], check=True)
    try:
        d0.start()  # the same daemon, same volume
        deadline = time.monotonic() + 10
        while "cannot empty the trash" not in d0.log() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "cannot empty the trash" in d0.log()
        assert d0.mgr("GET", "/volumes").status_code == 200
    finally:
        subprocess.run(["umount", str(stuck / "deep")], check=False)
    # The next rounds retry; the janitor's interval is at least a second.
    deadline = time.monotonic() + 30
    while stuck.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not stuck.exists()


def test_listings_stream_with_bounded_memory(make_daemon):
    """With scandir-limit = 0, 16 listings of a 200k-entry directory left RSS at 4 GB: the
    listing was built whole, as JSON objects, per request. It now streams as it is read."""
    d = make_daemon(storage_proxy={"scandir-limit": 0})
    vfid = d.create_vfolder()
    big = d.vfolder_path(vfid) / "big"
    big.mkdir()
    n = 100000
    for i in range(n):
        os.close(os.open(big / f"entry-with-a-longish-name-{i:07d}", os.O_CREAT | os.O_WRONLY,
                         0o644))
    peak = [rss_kib(d.proc.pid)]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], rss_kib(d.proc.pid))
            time.sleep(0.01)

    counts = []

    def listing():
        r = d.mgr("POST", "/folder/file/list",
                  json={"volume": "local", "vfid": vfid, "relpath": "big"}, timeout=300)
        assert r.status_code == 200, r.text[:200]
        items = r.json()["items"]
        counts.append(len(items))
        assert items[0]["type"] == "FILE" and items[0]["stat"]["size"] == 0

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        threads = [threading.Thread(target=listing) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        stop.set()
        sampler.join()
    assert counts == [n] * 16
    assert peak[0] < 128 * 1024, f"sluiced RSS peaked at {peak[0] / 1024:.0f} MiB"
