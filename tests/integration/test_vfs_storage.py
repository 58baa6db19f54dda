"""VFS artifact storages on the manager API: /v1/storages/vfs/{storage_name}/{files,download,meta}.

One daemon serves one storage ("models") over a tree built here: nested files and directories,
names with spaces and non-ASCII letters, symbolic links inside the base, out of it and
dangling, and a FIFO. What each route should answer is written out explicitly below.
"""

import io
import os
import pwd
import shutil
import stat
import tarfile
import tempfile
from pathlib import Path

import pytest

from conftest import problem, running_daemon, toml_value, write_tree

STORAGE = "models"
PREFIX = f"/v1/storages/vfs/{STORAGE}"
UNICODE_NAME = "sp ace \u00fc\u00f1\u00ee.txt"
BIG = os.urandom(3 << 20)

TREE = {
    "a.txt": "hello\n",
    UNICODE_NAME: "unicode\n",
    "big.bin": BIG,
    "sub/config.json": '{"x": 1}\n',
    "sub/empty": b"",
    "sub/deep/w.safetensors": os.urandom(5000),
    "sub/deep/notes.md": "# notes\n",
    "emptydir": None,
    "link_in": ("link", "sub/config.json"),  # a file inside the base
    "link_dir": ("link", "sub"),  # a directory inside the base
    "escape": ("link", "../outside/secret"),  # out of the base
    "dangling": ("link", "nowhere"),
}
DIRS = {"sub", "sub/deep", "emptydir"}
# What a listing of the base shows: files, directories, and links that lead to a regular file
# inside the base (listed as that file). Links to directories, out of the base or nowhere, and
# special files are left out.
LISTED = {
    "a.txt",
    UNICODE_NAME,
    "big.bin",
    "sub",
    "sub/config.json",
    "sub/empty",
    "sub/deep",
    "sub/deep/w.safetensors",
    "sub/deep/notes.md",
    "emptydir",
    "link_in",
}
LINKS = {"link_in", "link_dir", "escape", "escape_abs", "dangling"}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("vfs-storage")
    base = root / "artifacts"
    outside = root / "outside"
    base.mkdir()
    outside.mkdir()
    (outside / "secret").write_text("do not leak\n")
    write_tree(base, TREE)
    # An absolute link leaves the base by definition, even when it points back inside.
    os.symlink(outside / "secret", base / "escape_abs")
    os.mkfifo(base / "fifo")
    extra = (
        f"[artifact-storages.{STORAGE}]\n"
        'type = "vfs_storage"\n'
        f"[artifact-storages.{STORAGE}.vfs_storage]\n"
        f"base-path = {toml_value(str(base))}\n"
        # Not there yet: made at start, as the reference makes it.
        "[artifact-storages.fresh]\n"
        'type = "vfs_storage"\n'
        "[artifact-storages.fresh.vfs_storage]\n"
        f"base-path = {toml_value(str(root / 'fresh' / 'models'))}\n"
    )
    with running_daemon(root / "daemon", extra_toml=extra) as d:
        yield d, base


def files_of(r):
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"files"}
    return body["files"]


def list_dir(d, directory, storage=STORAGE):
    return d.mgr("GET", f"/v1/storages/vfs/{storage}/files", json={"directory": directory})


def check_preorder(paths):
    """Depth first, pre-order: a directory's descendants follow it in one unbroken run."""
    index = {p: i for i, p in enumerate(paths)}
    assert len(index) == len(paths), "duplicate paths"
    for p, i in index.items():
        below = sorted(index[q] for q in paths if q.startswith(p.rstrip("/") + "/"))
        assert below == list(range(i + 1, i + 1 + len(below))), f"{p}'s subtree is not contiguous"
        parent = p.rsplit("/", 1)[0]
        if parent in index:
            assert index[parent] < i, f"{p} comes before its parent"


# --------------------------------------------------------------------------- listing


def test_list_root_fields_and_order(env):
    d, base = env
    files = files_of(list_dir(d, "/"))
    paths = [f["path"] for f in files]
    assert set(paths) == {"/" + rel for rel in LISTED}
    check_preorder(paths)
    for f in files:
        rel = f["path"][1:]
        assert set(f) == {"name", "type", "size", "modified", "created", "path"}
        assert f["name"] == rel.rsplit("/", 1)[-1]
        st = os.stat(base / rel)  # follows link_in to its file, as the listing does
        if rel in DIRS:
            assert f["type"] == "directory" and f["size"] is None
        else:
            assert f["type"] == "file"
            assert f["size"] == st.st_size and isinstance(f["size"], int)
        assert isinstance(f["modified"], float) and isinstance(f["created"], float)
        assert f["modified"] == st.st_mtime
        assert f["created"] == st.st_ctime
    by_path = {f["path"]: f for f in files}
    assert by_path["/link_in"]["size"] == len('{"x": 1}\n')
    assert by_path["/big.bin"]["size"] == len(BIG)


@pytest.mark.parametrize(
    "directory,prefix",
    [(".", ""), ("", ""), ("./", ""), ("//", "//"), ("///", "/")],
    ids=["dot", "empty", "dot-slash", "two-slashes", "three-slashes"],
)
def test_list_root_path_forms(env, directory, prefix):
    """`path` is str(Path(directory) / relative), as the reference prints it."""
    d, _ = env
    paths = [f["path"] for f in files_of(list_dir(d, directory))]
    assert set(paths) == {prefix + rel for rel in LISTED}


@pytest.mark.parametrize(
    "directory,prefix",
    [("sub", "sub"), ("sub/", "sub"), ("./sub", "sub"), ("/sub", "/sub"), ("sub//deep/..x", None)],
    ids=["plain", "trailing-slash", "dot-slash", "absolute", "missing"],
)
def test_list_subdirectory_path_forms(env, directory, prefix):
    d, _ = env
    r = list_dir(d, directory)
    if prefix is None:
        assert r.status_code == 404, r.text
        return
    files = files_of(r)
    paths = [f["path"] for f in files]
    rels = {rel[len("sub/") :] for rel in LISTED if rel.startswith("sub/")}
    assert set(paths) == {f"{prefix}/{rel}" for rel in rels}
    check_preorder(paths)


def test_list_nested_prefix(env):
    d, _ = env
    paths = [f["path"] for f in files_of(list_dir(d, "sub/deep"))]
    assert sorted(paths) == ["sub/deep/notes.md", "sub/deep/w.safetensors"]


def test_list_empty_directory(env):
    d, _ = env
    assert files_of(list_dir(d, "emptydir")) == []


def test_list_through_link_inside_base(env):
    """A requested directory reached through a link that stays inside the base is listed."""
    d, _ = env
    paths = {f["path"] for f in files_of(list_dir(d, "link_dir"))}
    assert "link_dir/config.json" in paths and "link_dir/deep/notes.md" in paths


def test_list_parameter_in_query(env):
    d, _ = env
    r = d.mgr("GET", f"{PREFIX}/files", params={"directory": "sub/deep"})
    assert len(files_of(r)) == 2


def test_list_a_file_is_400(env):
    d, _ = env
    r = list_dir(d, "a.txt")
    assert r.status_code == 400, r.text
    assert "not a directory" in problem(r)["msg"]


@pytest.mark.parametrize("directory", ["nope", "sub/nope", "a.txt/x", "dangling"])
def test_list_missing_is_404(env, directory):
    d, _ = env
    r = list_dir(d, directory)
    assert r.status_code == 404, r.text
    problem(r)


@pytest.mark.parametrize(
    "directory", ["..", "../outside", "sub/../..", "/../outside", "sub/\x00", "escape", "escape_abs"]
)
def test_list_escape_is_400(env, directory):
    d, _ = env
    r = list_dir(d, directory)
    assert r.status_code == 400, r.text
    assert "do not leak" not in r.text
    problem(r)


# --------------------------------------------------------------------------- download


def download(d, filepath, storage=STORAGE, **kw):
    return d.mgr("POST", f"/v1/storages/vfs/{storage}/download", json={"filepath": filepath}, **kw)


@pytest.mark.parametrize(
    "filepath,ctype",
    [
        ("a.txt", "text/plain"),
        ("/a.txt", "text/plain"),
        ("big.bin", "application/octet-stream"),
        ("sub/config.json", "application/json"),
        ("sub/empty", "application/octet-stream"),
        ("sub/deep/w.safetensors", "application/octet-stream"),
    ],
)
def test_download_file(env, filepath, ctype):
    d, base = env
    r = download(d, filepath)
    assert r.status_code == 200, r.text[:300]
    want = (base / filepath.lstrip("/")).read_bytes()
    assert r.content == want
    assert r.headers["Content-Type"].split(";")[0] == ctype
    assert int(r.headers["Content-Length"]) == len(want)
    disp = r.headers["Content-Disposition"]
    assert disp.startswith("attachment")
    assert Path(filepath).name in disp


def test_download_unicode_name(env):
    d, base = env
    r = download(d, UNICODE_NAME)
    assert r.status_code == 200, r.text
    assert r.content == (base / UNICODE_NAME).read_bytes()
    # The name in RFC 5987 form (filename*=UTF-8''...), non-ASCII bytes percent-encoded.
    assert "filename*=UTF-8''sp%20ace%20%C3%BC%C3%B1%C3%AE.txt" in r.headers["Content-Disposition"]


def test_download_link_inside_base_sends_target(env):
    d, base = env
    r = download(d, "link_in")
    assert r.status_code == 200, r.text
    assert r.content == (base / "sub/config.json").read_bytes()


def read_tar(r):
    assert r.status_code == 200, r.text[:300]
    assert r.headers["Content-Type"].split(";")[0] == "application/x-tar"
    assert r.headers["Content-Disposition"].startswith("attachment")
    return tarfile.open(fileobj=io.BytesIO(r.content), mode="r:")


def check_tar(t, top):
    """The archive holds `top`'s contents under "./" like tar.add(top, arcname=".")."""
    members = t.getmembers()
    names = [m.name for m in members]
    assert names[0] == "."
    assert len(set(names)) == len(names)
    want = {"."}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if stat.S_ISFIFO(os.lstat(p).st_mode):
                continue  # special files are left out
            want.add("./" + p.relative_to(top).as_posix())
    assert set(names) == want
    check_preorder(names[1:])
    for m in members:
        p = top / m.name
        st = os.lstat(p)
        if m.name == ".":
            assert m.isdir()
        elif stat.S_ISLNK(st.st_mode):
            assert m.issym(), f"{m.name} should be stored as a link"
            assert m.linkname == os.readlink(p)
        elif stat.S_ISDIR(st.st_mode):
            assert m.isdir()
        else:
            assert m.isfile()
            assert t.extractfile(m).read() == p.read_bytes()
            assert m.size == st.st_size
            assert m.mode == stat.S_IMODE(st.st_mode)
            assert int(m.mtime) == int(st.st_mtime)
    return {m.name: m for m in members}


@pytest.mark.parametrize("filepath", ["/", ".", ""], ids=["slash", "dot", "empty"])
def test_download_root_as_tar(env, filepath):
    d, base = env
    r = download(d, filepath)
    members = check_tar(read_tar(r), base)
    for name in LINKS:
        assert members["./" + name].issym()
    assert members["./escape"].linkname == "../outside/secret"
    assert b"do not leak" not in r.content  # the outside file was not followed
    assert "./fifo" not in members
    assert members[f"./{UNICODE_NAME}"].isfile()
    assert members["./emptydir"].isdir()


def test_download_subdirectory_as_tar(env):
    d, base = env
    r = download(d, "sub")
    assert "sub.tar" in r.headers["Content-Disposition"]
    members = check_tar(read_tar(r), base / "sub")
    assert set(members) == {
        ".",
        "./config.json",
        "./empty",
        "./deep",
        "./deep/w.safetensors",
        "./deep/notes.md",
    }


def test_download_errors(env):
    d, _ = env
    for path, status in [
        ("nope", 404),
        ("sub/nope.bin", 404),
        ("dangling", 404),
        ("../outside/secret", 400),
        ("escape", 400),
        ("escape_abs", 400),
        ("a\x00b", 400),
        ("fifo", 400),
    ]:
        r = download(d, path)
        assert r.status_code == status, (path, r.text)
        assert "do not leak" not in r.text
        problem(r)


def test_a_missing_base_path_is_made_at_start(env):
    """Before, a base-path not yet made answered 503 with Retry-After: 1 on every route,
    forever; the reference makes it at start and lists an empty tree."""
    d, base = env
    made = base.parent / "fresh" / "models"
    assert made.is_dir()
    assert files_of(list_dir(d, "", storage="fresh")) == []
    assert "made its base-path" in d.log()


def test_a_loop_of_links_is_not_called_an_escape(env):
    d, base = env
    os.symlink("loop_b", base / "loop_a")
    os.symlink("loop_a", base / "loop_b")
    try:
        for r in (meta(d, "loop_a"), download(d, "loop_a"), list_dir(d, "loop_a")):
            assert r.status_code == 400, r.text
            body = problem(r)
            assert "too many levels of symbolic links" in body["msg"], body
            assert "outside" not in body["msg"], body
            assert body["errno"] == 40, body
    finally:
        (base / "loop_a").unlink()
        (base / "loop_b").unlink()


def test_unreadable_entries_are_left_out():
    """A directory or file the daemon may not read (a root-owned lost+found at a file system's
    root, a private directory) is left out of listings and archives, with a log line, and the
    rest is sent whole. Before, the first one cut the 200 answer off after its head (an empty
    chunked body), so no listing or archive above it could be had at all; and the routes that
    name one answered 403 "Forbidden", as for a refused token, not the contract's 400."""
    # The daemon runs as nobody when the tests run as root (root reads everything), and
    # outside pytest's 0700 temporary directories so that it can reach its base.
    root = Path(tempfile.mkdtemp(prefix="sluice-vfs-"))
    try:
        os.chmod(root, 0o755)
        base = root / "artifacts"
        write_tree(base, {"a.txt": "a\n", "locked/secret.txt": "s\n", "private.bin": "p",
                          "sub/b.txt": "b\n"})
        for p in (root, base, base / "sub", base / "a.txt", base / "sub" / "b.txt"):
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        os.chmod(base / "locked", 0)
        os.chmod(base / "private.bin", 0)
        sp = {}
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            sp = {"user": "nobody", "group": nobody.pw_gid}
        extra = (
            f"[artifact-storages.{STORAGE}]\n"
            'type = "vfs_storage"\n'
            f"[artifact-storages.{STORAGE}.vfs_storage]\n"
            f"base-path = {toml_value(str(base))}\n"
        )
        with running_daemon(root / "daemon", extra_toml=extra, storage_proxy=sp) as d:
            files = {f["path"]: f for f in files_of(list_dir(d, ""))}
            # The locked directory is listed (its own attributes are readable), not entered;
            # the private file is listed too (stat needs no read permission).
            assert set(files) == {"a.txt", "locked", "private.bin", "sub", "sub/b.txt"}, files
            assert files["locked"]["type"] == "directory"
            r = download(d, "")
            assert r.status_code == 200, r.text
            with tarfile.open(fileobj=io.BytesIO(r.content)) as t:
                names = set(t.getnames())
                assert names == {".", "./a.txt", "./locked", "./sub", "./sub/b.txt"}, names
                assert t.extractfile("./sub/b.txt").read() == b"b\n"
            for r in (download(d, "private.bin"), list_dir(d, "locked"), download(d, "locked")):
                assert r.status_code == 400, r.text
                assert problem(r)["errno"] == 13, r.text
            log = d.log()
            assert "'locked' left out" in log and "'./private.bin' left out" in log, log[-2000:]
    finally:
        for p in (root / "artifacts" / "locked", root / "artifacts" / "private.bin"):
            if p.exists():
                os.chmod(p, 0o755)
        shutil.rmtree(root, ignore_errors=True)


# --------------------------------------------------------------------------- meta


def meta(d, filepath, storage=STORAGE, **kw):
    return d.mgr("GET", f"/v1/storages/vfs/{storage}/meta", json={"filepath": filepath}, **kw)


def test_meta_file(env):
    d, base = env
    r = meta(d, "sub/config.json")
    assert r.status_code == 200, r.text
    j = r.json()
    st = os.stat(base / "sub/config.json")
    assert j == {
        "filepath": "sub/config.json",
        "content_length": st.st_size,
        "content_type": "application/json",
        "last_modified": st.st_mtime,
        "created": st.st_ctime,
        "is_directory": False,
        "metadata": {"mode": oct(st.st_mode), "uid": str(st.st_uid), "gid": str(st.st_gid)},
    }


def test_meta_directory(env):
    d, base = env
    for filepath, p in [("sub", base / "sub"), ("/", base)]:
        r = meta(d, filepath)
        assert r.status_code == 200, r.text
        j = r.json()
        st = os.stat(p)
        assert j["filepath"] == filepath
        assert j["is_directory"] is True
        assert j["content_length"] is None and j["content_type"] is None
        assert j["last_modified"] == st.st_mtime and j["created"] == st.st_ctime
        assert j["metadata"]["mode"] == oct(st.st_mode)


def test_meta_link_inside_base_describes_target(env):
    d, base = env
    j = meta(d, "link_in").json()
    assert j["content_length"] == os.stat(base / "sub/config.json").st_size
    assert j["metadata"]["mode"].startswith("0o100")


def test_meta_errors(env):
    d, _ = env
    for path, status in [("nope", 404), ("..", 400), ("sub/../../x", 400), ("escape", 400)]:
        r = meta(d, path)
        assert r.status_code == status, (path, r.text)
        problem(r)


# --------------------------------------------------------------------------- shared errors

ROUTES = [
    ("GET", "files", "directory"),
    ("POST", "download", "filepath"),
    ("GET", "meta", "filepath"),
]
ROUTE_IDS = [f"{m}-{r}" for m, r, _ in ROUTES]


@pytest.mark.parametrize("method,route,key", ROUTES, ids=ROUTE_IDS)
def test_unknown_storage_is_404(env, method, route, key):
    d, _ = env
    r = d.mgr(method, f"/v1/storages/vfs/no-such-storage/{route}", json={key: "/"})
    assert r.status_code == 404, r.text
    j = problem(r)
    assert j["error_code"] == "storage_read_not-found"
    assert j["type"] == "https://api.backend.ai/probs/storage/object-not-found"
    assert j["title"] == "Storage Config Not Found"
    assert j["msg"] == "No VFS storage configuration found for: no-such-storage"


@pytest.mark.parametrize("method,route,key", ROUTES, ids=ROUTE_IDS)
def test_missing_parameter_is_400(env, method, route, key):
    d, _ = env
    for body in ({}, {key: None}, {key: 3}):
        r = d.mgr(method, f"{PREFIX}/{route}", json=body)
        assert r.status_code == 400, (body, r.text)
        assert key in problem(r)["msg"]


@pytest.mark.parametrize("token", [False, "wrong-secret"], ids=["missing", "wrong"])
@pytest.mark.parametrize("method,route,key", ROUTES, ids=ROUTE_IDS)
def test_needs_manager_token(env, method, route, key, token):
    d, _ = env
    r = d.mgr(method, f"{PREFIX}/{route}", json={key: "a.txt"}, token=token)
    assert r.status_code == 403, r.text
    assert "hello" not in r.text
    problem(r)
