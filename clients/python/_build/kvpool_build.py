# SPDX-License-Identifier: Apache-2.0
"""A PEP 517/660 build backend for the pure-Python kvpool package, with the
standard library only, so `pip install ./clients/python` needs no network.
The version is kvpool.__version__ (which test_client holds to the C
library's). Builds py3-none-any wheels: nothing is compiled."""
import base64
import hashlib
import os
import re
import zipfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "kvpool"


def _version():
    with open(os.path.join(HERE, NAME, "__init__.py"), encoding="utf-8") as f:
        m = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M)
    if not m:
        raise RuntimeError("kvpool/__init__.py has no __version__")
    return m.group(1)


def _metadata(version):
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {version}\n"
            "Summary: Python client of kvpoold, the remote vLLM KV-cache block pool\n"
            "License: Apache-2.0\nRequires-Python: >=3.9\n"
            # what the package loads from the system: the C client (kvpool's .deb, or KVPOOL_LIB)
            "Requires-External: libkvpool.so.0.2\n"
            # the examples' extra: pip install 'kvpool[numpy]'
            "Provides-Extra: numpy\nRequires-Dist: numpy; extra == \"numpy\"\n")


def _wheel(directory, files, version, tag="py3-none-any"):
    """files: {archive name: bytes}. Writes the wheel, returns its name."""
    dist = f"{NAME}-{version}.dist-info"
    files = dict(files)
    files[f"{dist}/METADATA"] = _metadata(version).encode()
    files[f"{dist}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: kvpool_build\n"
                              f"Root-Is-Purelib: true\nTag: {tag}\n").encode()
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = f"{NAME}-{version}-{tag}.whl"
    with zipfile.ZipFile(os.path.join(directory, wheel), "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data)
    return wheel


def _sources():
    out = {}
    pkg = os.path.join(HERE, NAME)
    for name in sorted(os.listdir(pkg)):
        if name.endswith(".py") or name == "py.typed":  # py.typed: the hints are for users (PEP 561)
            with open(os.path.join(pkg, name), "rb") as f:
                out[f"{NAME}/{name}"] = f.read()
    return out


def get_requires_for_build_wheel(config_settings=None):
    return []


get_requires_for_build_editable = get_requires_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, _sources(), _version())


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """An editable install: a .pth file pointing at this source tree."""
    return _wheel(wheel_directory, {f"_{NAME}_editable.pth": (HERE + "\n").encode()}, _version())


def build_sdist(sdist_directory, config_settings=None):
    import tarfile
    version = _version()
    base = f"{NAME}-{version}"
    path = os.path.join(sdist_directory, base + ".tar.gz")
    with tarfile.open(path, "w:gz") as t:
        for rel in ["pyproject.toml", "README.md", "_build/kvpool_build.py"] + \
                [n for n in _sources()]:
            t.add(os.path.join(HERE, rel), arcname=f"{base}/{rel}")
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        data = _metadata(version).encode()
        info.size = len(data)
        import io
        t.addfile(info, io.BytesIO(data))
    return base + ".tar.gz"
