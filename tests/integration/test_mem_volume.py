"""Every API over a volume that is not a directory tree: the in-memory backend (`backend =
"mem"`). Its files have no descriptor to send zero-copy, its directories no path: what works
here works through the Volume interface alone."""

import io
import os
import zipfile

import pytest
import requests

from conftest import running_daemon, toml_section
from test_download import archive_token, download_token
from test_upload import new_session, offset_of, patch

MiB = 1 << 20


@pytest.fixture(scope="module")
def mem(tmp_path_factory):
    with running_daemon(
        tmp_path_factory.mktemp("sluiced-mem"),
        extra_toml=toml_section("volume.ram", {"backend": "mem", "path": "mem",
                                                "options": {"capacity": "64m"}}),
    ) as d:
        yield d


def test_upload_download_list_and_archive(mem):
    d = mem
    vfid = d.create_vfolder(volume="ram")
    data = os.urandom(3 * MiB + 17)
    token = new_session(d, vfid, "dir/blob.bin", len(data), volume="ram")
    assert patch(d, token, 0, data[:MiB]).status_code == 204
    assert offset_of(d, token) == MiB
    assert patch(d, token, MiB, data[MiB:]).status_code == 204

    url = d.client_url("/download")
    r = requests.get(url, params={"token": download_token(d, vfid, "dir/blob.bin", volume="ram")})
    assert r.status_code == 200 and r.content == data
    r = requests.get(url, params={"token": download_token(d, vfid, "dir/blob.bin", volume="ram")},
                     headers={"Range": "bytes=100-199,1000-1009"})
    assert r.status_code == 206 and r.headers["Content-Type"].startswith("multipart/byteranges")

    assert d.file_op("ram", "mkdir", vfid=vfid, relpath="dir/empty").status_code == 200
    items = d.file_op("ram", "list", vfid=vfid, relpath="dir").json()["items"]
    assert sorted((i["name"], i["type"]) for i in items) == [("blob.bin", "FILE"),
                                                             ("empty", "DIRECTORY")]
    blob = next(i for i in items if i["name"] == "blob.bin")
    assert blob["stat"]["size"] == len(data)

    r = requests.get(d.client_url("/download-archive"),
                     params={"token": archive_token(d, vfid, ["dir"], volume="ram")}, timeout=60)
    assert r.status_code == 200
    assert zipfile.ZipFile(io.BytesIO(r.content)).read("dir/blob.bin") == data
    r = requests.get(url, params={"token": download_token(d, vfid, "dir", archive=True,
                                                          volume="ram")})
    assert r.status_code == 200
    z = zipfile.ZipFile(io.BytesIO(r.content))
    assert z.read("blob.bin") == data

    usage = d.mgr("GET", "/folder/usage", json={"volume": "ram", "vfid": vfid}).json()
    assert usage["used_bytes"] == len(data)


def test_file_operations_and_errors(mem):
    d = mem
    vfid = d.create_vfolder(volume="ram")
    token = new_session(d, vfid, "a.txt", 3, volume="ram")
    assert patch(d, token, 0, b"abc").status_code == 204
    assert d.file_op("ram", "rename", vfid=vfid, relpath="a.txt", new_name="b.txt").status_code == 204
    assert d.file_op("ram", "move", vfid=vfid, src_relpath="b.txt", dst_relpath="c.txt").status_code == 204
    r = d.file_op("ram", "fetch", vfid=vfid, relpath="c.txt")
    assert r.status_code == 200 and r.content == b"abc"
    assert d.file_op("ram", "fetch", vfid=vfid, relpath="../x").status_code == 400
    assert d.file_op("ram", "fetch", vfid=vfid, relpath="nope").status_code == 400
    r = d.mgr("GET", "/folder/mount", json={"volume": "ram", "vfid": vfid})
    assert r.status_code == 400  # nothing to mount: the data is in memory
    assert d.file_op("ram", "delete", vfid=vfid, relpaths=["c.txt"]).status_code == 200
    assert d.file_op("ram", "list", vfid=vfid, relpath=".").json()["items"] == []
    assert d.delete_vfolder(vfid, volume="ram")["status"] == "completed"


def test_capacity_is_enforced(mem):
    d = mem
    vfid = d.create_vfolder(volume="ram")
    token = new_session(d, vfid, "huge.bin", 80 * MiB, volume="ram")
    r = patch(d, token, 0, b"x" * (80 * MiB))
    assert r.status_code == 507
    assert int(r.headers["Upload-Offset"]) < 80 * MiB
