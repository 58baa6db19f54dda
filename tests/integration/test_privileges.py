"""[storage-proxy] user/group: started as root, sluiced binds, then runs as that user."""

import os
import pwd
import shutil
import tempfile
from pathlib import Path

from conftest import new_vfid, start_daemon


def proc_ids(pid):
    ids = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("Uid:", "Gid:")):
            key, real, eff, *_ = line.split()
            ids[key[:-1]] = (int(real), int(eff))
    return ids


def test_drops_privileges_after_binding():
    nobody = pwd.getpwnam("nobody")
    # Outside pytest's 0700 temp dirs, so that the unprivileged daemon can reach its volume.
    root = Path(tempfile.mkdtemp(prefix="sluice-priv-"))
    try:
        os.chmod(root, 0o755)
        run = root / "run"
        run.mkdir()
        pid_file = run / "sluiced.pid"
        d = start_daemon(
            root / "d",
            storage_proxy={"user": "nobody", "group": nobody.pw_gid, "pid-file": str(pid_file)},
        )
        try:
            ids = proc_ids(d.proc.pid)
            if os.geteuid() == 0:
                assert ids["Uid"] == (nobody.pw_uid, nobody.pw_uid), ids
                assert ids["Gid"] == (nobody.pw_gid, nobody.pw_gid), ids
                assert "dropped privileges" in d.log()
            else:
                assert ids["Uid"][1] == os.geteuid()
                assert "does not run as root" in d.log()
            assert pid_file.read_text().strip() == str(d.proc.pid)
            # The volume belongs to root: the unprivileged daemon reports it and refuses writes.
            r = d.mgr("GET", "/volume/hwinfo", json={"volume": "local"})
            assert r.status_code == 200
            if os.geteuid() == 0:
                assert r.json()["status"] == "degraded", r.json()
                r = d.mgr("POST", "/folder/create", json={"volume": "local", "vfid": new_vfid()})
                assert r.status_code == 403, r.text
                # Hand the volume over and creation works, owned by the daemon's user.
                os.chown(d.vol, nobody.pw_uid, nobody.pw_gid)
                vfid = new_vfid()
                r = d.mgr("POST", "/folder/create", json={"volume": "local", "vfid": vfid})
                assert r.status_code == 204, r.text
                assert d.vfolder_path(vfid).stat().st_uid == nobody.pw_uid
        finally:
            d.stop()
            d.kill()
    finally:
        shutil.rmtree(root, ignore_errors=True)
