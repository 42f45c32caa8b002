"""The engine's worker maps a weight image without touching the generator's resource tracker.

Regression: vLLM's processes share the generator's Python resource tracker (spawn hands them its
fd); the worker attached through ``SharedMemory`` (which registers the name) and then unregistered
it, which removed the generator's own registration. The generator's unlink then made the tracker
print ``KeyError: '/psm_...'`` tracebacks into the generator's log and warn of leaked shared memory
at exit (seen in the elastic drill's logs).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.process

SCRIPT = textwrap.dedent(
    """
    import hashlib, multiprocessing as mp
    from stream_dapo.weights.image import WeightImage, map_image

    def worker(name, nbytes):
        with map_image(name, nbytes) as view:
            return hashlib.sha256(view).hexdigest()

    if __name__ == "__main__":
        image = WeightImage(1 << 20)
        image.view[:] = bytes(range(256)) * 4096
        with mp.get_context("spawn").Pool(1) as pool:  # shares this process's resource tracker
            digest = pool.apply(worker, (image.name, image.nbytes))
        assert digest == hashlib.sha256(image.view).hexdigest(), "the worker saw other bytes"
        image.close()
        print("ok")
    """
)


def test_a_worker_mapping_leaves_the_creators_tracker_alone(tmp_path) -> None:
    script = tmp_path / "scenario.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    assert "KeyError" not in done.stderr, done.stderr
    assert "leaked shared_memory" not in done.stderr, done.stderr
