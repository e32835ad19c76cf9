"""The "auto" policy's decisions (fused or eager, per chain, kind of GPU and pass), stored beside
the tuning database so that other processes on that kind of GPU reuse them. A key is the caller's
(fusejit.torch._decision_key): an inference decision's has no "pass"; a training step's adds
"pass": "train" and which gradients it needs, so the two are decided and stored apart.

Same discipline as the kernel cache and the tuning database: one file per key below
<cache dir>/policy/ (the cache dir from libfusejit: FUSEJIT_CACHE_DIR, else XDG_CACHE_HOME/fusejit,
else ~/.cache/fusejit), written atomically (temporary file + rename), holding its full key and a
SHA-256 checksum; a file that is truncated, corrupted, or holds another key is ignored (and
replaced by the next decision), never trusted. The folder is created 0700 and refused when it is a
symbolic link or owned by another user. FUSEJIT_DISABLE_TUNING=1 turns the store off (decisions are
then kept for the process only).
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
import threading
from typing import Dict, Optional

FORMAT = 1


def _folder_ok(path: str) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            st = os.lstat(path)
        except OSError:
            return False
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()


class DecisionStore(object):
    def __init__(self, cache_dir: Optional[str]):
        self._lock = threading.Lock()
        self._memory = {}  # type: Dict[str, dict]
        disabled = os.environ.get("FUSEJIT_DISABLE_TUNING") == "1"
        self.folder = None  # type: Optional[str]
        if cache_dir and not disabled:
            folder = os.path.join(cache_dir, "policy")
            if _folder_ok(cache_dir) and _folder_ok(folder):
                self.folder = folder
        self.rejected = 0  # files found invalid

    @staticmethod
    def key_text(material: dict) -> str:
        return json.dumps(material, sort_keys=True, separators=(",", ":"))

    def _path(self, key: str) -> str:
        return os.path.join(self.folder, hashlib.sha256(key.encode()).hexdigest()[:32] + ".json")

    def get(self, material: dict) -> Optional[dict]:
        key = self.key_text(material)
        with self._lock:
            if key in self._memory:
                return self._memory[key]
        if self.folder is None:
            return None
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            return None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            data = os.read(fd, 1 << 16)
        finally:
            os.close(fd)
        entry = self._decode(data, key)
        if entry is None:
            self.rejected += 1
            return None
        with self._lock:
            self._memory[key] = entry
        return entry

    @staticmethod
    def _decode(data: bytes, key: str) -> Optional[dict]:
        try:
            body, checksum = data.rstrip(b"\n").rsplit(b"\n", 1)
            if hashlib.sha256(body).hexdigest().encode() != checksum:
                return None
            entry = json.loads(body.decode())
            if entry.get("format") != FORMAT or entry.get("key") != key:
                return None
            if entry.get("decision") not in ("fused", "eager"):
                return None
            return entry
        except (ValueError, UnicodeDecodeError, AttributeError):
            return None

    def put(self, material: dict, decision: str, details: dict) -> None:
        key = self.key_text(material)
        entry = dict(details)
        entry.update({"format": FORMAT, "key": key, "decision": decision})
        with self._lock:
            self._memory[key] = entry
        if self.folder is None:
            return
        body = json.dumps(entry, sort_keys=True).encode()
        data = body + b"\n" + hashlib.sha256(body).hexdigest().encode() + b"\n"
        try:
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-", suffix=".json")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self._path(key))
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
        except OSError:
            pass  # the decision still holds for this process
