"""Running SQL scripts on mergestream (`storage-node local`) and on ClickHouse 26.9 (chDB)."""

import itertools
import os
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(os.environ.get("MERGESTREAM_BIN", ROOT / "target" / "debug" / "storage-node"))


def split_statements(script: str) -> list[str]:
    """Splits at semicolons outside quotes and comments, as `storage-node local` does."""
    out, current, i, quote = [], [], 0, None
    while i < len(script):
        c = script[i]
        if quote:
            current.append(c)
            if c == "\\":
                current.append(script[i + 1 : i + 2])
                i += 2
                continue
            if c == quote:
                quote = None
        elif c in "'\"`":
            quote = c
            current.append(c)
        elif script.startswith("--", i):
            end = script.find("\n", i)
            i = len(script) if end < 0 else end
            continue
        elif c == ";":
            text = "".join(current).strip()
            if text:
                out.append(text)
            current = []
        else:
            current.append(c)
        i += 1
    text = "".join(current).strip()
    if text:
        out.append(text)
    return out


class Result:
    def __init__(self, stdout: str, stderr: str, code: int):
        self.stdout, self.stderr, self.code = stdout, stderr, code

    def __repr__(self):
        return f"Result(code={self.code}, stderr={self.stderr[-2000:]!r})"


def run_ours(script: str, path: Path | None = None, fmt: str = "TSV", timeout: float = 120) -> Result:
    """Runs a script in one `storage-node local` process."""
    with tempfile.TemporaryDirectory() as tmp:
        data = path or Path(tmp)
        proc = subprocess.run(
            [str(BIN), "local", "--path", str(data), "--format", fmt],
            input=script,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return Result(proc.stdout, proc.stderr, proc.returncode)


class Oracle:
    """One chDB session; every script runs in a fresh database of its own."""

    _ids = itertools.count()

    def __init__(self):
        from chdb import session

        self._session = session.Session()

    def run(self, script: str, fmt: str = "TSV") -> str:
        db = f"case_{os.getpid()}_{next(self._ids)}"
        self._session.query(f"CREATE DATABASE {db}")
        self._session.query(f"USE {db}")
        try:
            out = []
            for statement in split_statements(script):
                result = self._session.query(statement, fmt)
                out.append(str(result))
            return "".join(out)
        finally:
            self._session.query("USE default")
            self._session.query(f"DROP DATABASE {db} SYNC")
