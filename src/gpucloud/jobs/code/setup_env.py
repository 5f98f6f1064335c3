"""``submit --setup CMD``: the job's packages, in a virtualenv cached per node and requirements hash.

Which Python runs a job. A job with ``--workdir`` or ``--setup`` runs with the interpreter that
runs gpucloud itself first on ``PATH`` (others keep the supervisor's ``PATH``). On the gpucloud image that is ``/opt/gpucloud/venv`` (``images/scripts/pytorch.sh``:
Python 3.12 with the pinned CUDA build of torch from ``images/versions.yaml``), the one the agent
runs from; a systemd unit's ``PATH`` would otherwise find ``/usr/bin/python3``, which has no torch.

A job with ``--setup`` gets a virtualenv of its own on top of that one:

* created by that interpreter with ``--system-site-packages``, and a ``.pth`` file naming the
  interpreter's own site-packages: a venv made from inside a venv inherits the *base* Python's
  packages only (``python -m venv`` uses ``sys._base_executable``), so without the ``.pth`` the
  image's torch would be missing. The job's own packages come first on ``sys.path``; pip sees
  the image's torch as installed and leaves it alone (unless a requirement pins another torch,
  which then shadows the image's CUDA build: do not pin torch);
* ``CMD`` runs once in it (``/bin/sh -c``, in the attempt's working directory, the venv's ``bin``
  first on ``PATH``, ``VIRTUAL_ENV`` set), its output in the attempt's log;
* cached in ``<cache>/envs/<key>``: the key is a hash of the interpreter, ``CMD`` and the content
  of the requirement files it names (``-r``/``-c``, and the ``-r`` lines inside them) and of the
  workdir's top-level ``requirements*.txt``; with none of those, the snapshot's hash. The next
  attempt on the node, and the next job with the same requirements, skip the install.
* a failed setup fails the attempt with one line (its exit code and last output lines) and leaves
  no env behind, so a resumed job runs it again;
* **never run in place.** Once set up, the cached env is sealed: a manifest of every file (its
  SHA-256 and mode), link and directory is written beside it (``<key>.manifest.json``) and its files
  are made read-only. Each attempt runs in a private copy (``<attempt dir>/venv``), made in one pass
  that checks every byte and name against the manifest; the copy's scripts name the copy. So what a
  job writes into its env while it runs (a ``pip install``, a planted ``.pth``) stays in its own
  copy and goes with its attempt, and a cache that changed anyway (a file edited, one added) is
  not used: it is set up again. (Jobs that run as the same Unix user can still write each other's
  files; isolation from a deliberately hostile job needs separate users or containers.)
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

from gpucloud.jobs.code.unpack import node_lock
from gpucloud.jobs.process_group import OutputSink
from gpucloud.regular_files import open_regular

READY = ".gpucloud-ready"
PRIVATE = "venv"  # the attempt's copy, in its attempt directory
_CHUNK = 1 << 20
BASE_PTH = "_gpucloud_image_site.pth"
_REQUIREMENT_FLAGS = ("-r", "--requirement", "-c", "--constraint")
_TAIL = 3


class SetupFailed(Exception):
    """The setup command failed or its env could not be made; ``str`` is one line."""


class EnvChanged(Exception):
    """The cached env no longer matches its manifest; ``str`` names the first difference."""


def interpreter_bin() -> str:
    """The directory of the interpreter running gpucloud (``/opt/gpucloud/venv/bin`` on the image)."""
    return str(Path(sys.executable).parent)


def with_interpreter_first(env: dict[str, str], venv: Path | None = None) -> dict[str, str]:
    """``env`` with the job's venv (if any), then gpucloud's interpreter, first on ``PATH``."""
    first = [str(venv / "bin")] if venv is not None else []
    first.append(interpreter_bin())
    rest = [p for p in env.get("PATH", os.defpath).split(os.pathsep) if p and p not in first]
    updated = {**env, "PATH": os.pathsep.join([*first, *rest])}
    updated.pop("PYTHONHOME", None)
    if venv is not None:
        updated["VIRTUAL_ENV"] = str(venv)
    return updated


def requirement_files(setup: str, workdir: Path) -> list[Path]:
    """The requirement files the setup depends on: those it names, the ``-r`` lines inside them, and
    the workdir's top-level ``requirements*.txt``; sorted, existing or not (a missing one hashes as missing)."""
    try:
        words = shlex.split(setup)
    except ValueError:
        words = setup.split()
    named = [workdir / p for p in _flag_values(words)]
    named += sorted(workdir.glob("requirements*.txt"))
    found: dict[Path, None] = {}
    pending = collections.deque(named)
    while pending:
        path = pending.popleft()
        if path in found:
            continue
        found[path] = None
        if path.is_file():
            try:
                lines = path.read_text(errors="replace").splitlines()
            except OSError:
                continue
            for line in lines:
                words = line.split("#", 1)[0].split()
                pending.extend(path.parent / p for p in _flag_values(words))
    return sorted(found)


def _flag_values(words: list[str]) -> list[str]:
    values = []
    for i, word in enumerate(words):
        if word in _REQUIREMENT_FLAGS and i + 1 < len(words):
            values.append(words[i + 1])
        elif word.startswith(("--requirement=", "--constraint=")):
            values.append(word.split("=", 1)[1])
        elif word.startswith(("-r", "-c")) and len(word) > 2 and not word.startswith("--"):
            values.append(word[2:])
    return values


def env_key(setup: str, workdir: Path, *, code_sha256: str | None) -> str:
    sha = hashlib.sha256(b"gpucloud-setup-env-v1\n")
    sha.update(f"{sys.executable}\n{sys.version}\n{setup}\n".encode())
    files = requirement_files(setup, workdir)
    for path in files:
        rel = os.path.relpath(path, workdir)
        content = path.read_bytes() if path.is_file() else b"<missing>"
        sha.update(f"{rel}\n{len(content)}\n".encode() + content)
    if not files:  # nothing tells what the setup depends on: one env per snapshot
        sha.update(f"code {code_sha256}\n".encode())
    return sha.hexdigest()[:24]


def ensure_env(
    setup: str,
    *,
    workdir: Path,
    cache: Path,
    code_sha256: str | None,
    env: dict[str, str],
    sink: OutputSink,
    into: Path,
) -> tuple[Path, bool]:
    """A private copy, at ``into``, of the job's cached venv with ``setup`` run in it; (the copy's
    path, whether the env was cached). A cached env that changed since it was sealed is set up again."""
    key = env_key(setup, workdir, code_sha256=code_sha256)
    venv = cache / "envs" / key
    manifest = cache / "envs" / f"{key}.manifest.json"
    if _sealed(venv, manifest):
        try:
            return private_copy(venv, manifest, into), True
        except EnvChanged as err:
            sink.write(f"the cached setup env {venv} changed since it was set up ({err}); setting it up again\n")
    with node_lock(cache / "envs" / f"{key}.lock"):
        if _sealed(venv, manifest):
            try:
                return private_copy(venv, manifest, into), True
            except EnvChanged as err:
                sink.write(f"the cached setup env {venv} changed since it was set up ({err}); setting it up again\n")
        _remove(venv, manifest)  # a leftover of a setup that died, or a changed env: never half an env
        try:
            _create(venv)
            _run_setup(setup, workdir, with_interpreter_first(env, venv), sink)
            (venv / READY).write_text(f"{setup}\n")
            seal(venv, manifest)
        except BaseException:
            _remove(venv, manifest)
            raise
        return private_copy(venv, manifest, into), False


def _sealed(venv: Path, manifest: Path) -> bool:
    return (venv / READY).exists() and manifest.is_file()


def _remove(venv: Path, manifest: Path) -> None:
    manifest.unlink(missing_ok=True)
    shutil.rmtree(venv, ignore_errors=True)  # read-only files go: removing needs the directory's write bit


def _walk(root: Path) -> dict[str, dict[str, object]]:
    """Every entry under ``root`` by relative path: files (mode, sha256), links (target), directories."""
    found: dict[str, dict[str, object]] = {}
    for folder, dirs, names in os.walk(root):
        for name in sorted(dirs + names):
            path = Path(folder) / name
            rel = str(path.relative_to(root))
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                found[rel] = {"link": os.readlink(path)}
            elif stat.S_ISDIR(st.st_mode):
                found[rel] = {"dir": True}
            elif stat.S_ISREG(st.st_mode):
                found[rel] = {"mode": stat.S_IMODE(st.st_mode) | stat.S_IWUSR, "sha256": _sha256(path)}
            else:
                raise EnvChanged(f"{rel} is not a file, a directory or a link")
    return found


def _sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with open_regular(path, follow_links=False) as fh:
        while chunk := fh.read(_CHUNK):
            sha.update(chunk)
    return sha.hexdigest()


def seal(venv: Path, manifest: Path) -> None:
    """Record the set-up env (``manifest``, beside it) and make its files read-only."""
    entries = _walk(venv)
    tmp = manifest.with_name(manifest.name + ".tmp")
    tmp.write_text(json.dumps({"root": str(venv), "entries": entries}))
    os.replace(tmp, manifest)
    for rel, entry in entries.items():
        if "sha256" in entry:
            os.chmod(venv / rel, int(str(entry["mode"])) & ~0o222)


def private_copy(venv: Path, manifest: Path, into: Path) -> Path:
    """Copy the sealed ``venv`` to ``into``, checking each name and byte against ``manifest`` in the
    same pass (EnvChanged at the first difference); the copy's scripts (``bin/``) name the copy."""
    try:
        recorded = json.loads(manifest.read_text())["entries"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise EnvChanged(f"its manifest is unreadable: {err}") from None
    if not isinstance(recorded, dict):
        raise EnvChanged("its manifest is unreadable")
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    old, new = str(venv).encode(), str(into).encode()
    seen: set[str] = set()
    for folder, dirs, names in os.walk(venv):
        for name in sorted(dirs + names):
            src = Path(folder) / name
            rel = str(src.relative_to(venv))
            entry = recorded.get(rel)
            seen.add(rel)
            if not isinstance(entry, dict):
                raise EnvChanged(f"{rel} was added")
            _copy_entry(src, into / rel, rel, entry, old, new)
    missing = sorted(set(recorded) - seen)
    if missing:
        raise EnvChanged(f"{missing[0]} was removed")
    return into


def _copy_entry(src: Path, dst: Path, rel: str, entry: dict[str, object], old: bytes, new: bytes) -> None:
    st = src.lstat()
    if "link" in entry:
        if not stat.S_ISLNK(st.st_mode) or os.readlink(src) != entry["link"]:
            raise EnvChanged(f"{rel} changed")
        os.symlink(os.readlink(src), dst)
    elif "dir" in entry:
        if not stat.S_ISDIR(st.st_mode):
            raise EnvChanged(f"{rel} changed")
        dst.mkdir()
    else:
        if not stat.S_ISREG(st.st_mode):
            raise EnvChanged(f"{rel} changed")
        sha = hashlib.sha256()
        with open_regular(src, follow_links=False) as fh, open(dst, "xb") as out:
            while chunk := fh.read(_CHUNK):
                sha.update(chunk)
                out.write(chunk)
        if sha.hexdigest() != entry.get("sha256"):
            raise EnvChanged(f"{rel} changed")
        if rel.startswith("bin" + os.sep) and st.st_size < _CHUNK:  # shebangs and activate scripts
            data = dst.read_bytes()
            if old in data:
                dst.write_bytes(data.replace(old, new))
        os.chmod(dst, int(str(entry.get("mode", 0o644))))


def _create(venv: Path) -> None:
    # Created where it stays: a venv's scripts name their interpreter by absolute path.
    made = subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        last = " | ".join(line for line in made.stderr.splitlines() if line.strip())[-300:]
        raise SetupFailed(f"cannot create the job's virtualenv {venv} with {sys.executable}: {last}")
    ours = [p for p in dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])]
    asked = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    site_dir = Path(asked.stdout.strip())
    if asked.returncode != 0 or not site_dir.is_dir():
        raise SetupFailed(f"the job's virtualenv {venv} has no site-packages directory")
    # The image's packages (torch) after the job's own: see the module's docstring.
    (site_dir / BASE_PTH).write_text("".join(f"{p}\n" for p in ours))


def _run_setup(setup: str, workdir: Path, env: dict[str, str], sink: OutputSink) -> None:
    tail: collections.deque[str] = collections.deque(maxlen=_TAIL)
    proc = subprocess.Popen(
        ["/bin/sh", "-c", setup],
        cwd=workdir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        sink.write(line)
        if line.strip():
            tail.append(line.strip())
    code = proc.wait()
    sink.flush()
    if code != 0:
        said = f"; last output: {' | '.join(tail)}" if tail else ""
        raise SetupFailed(f"the setup command {setup!r} exited with {code}{said}")
