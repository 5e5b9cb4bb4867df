"""example.py keeps working against a real node."""
import pathlib
import subprocess
import sys

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "example.py"


def test_example(node):
    r = subprocess.run([sys.executable, str(EXAMPLE), "--addr", node.addr, "--text", "x" * 45],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "stored 2 blocks" in r.stdout and "cached 32 of 45 tokens" in r.stdout and "KV matches" in r.stdout
