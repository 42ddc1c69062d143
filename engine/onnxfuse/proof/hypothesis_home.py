"""Where hypothesis keeps its files when a command draws with it (`check`, `fuzz`)."""

from __future__ import annotations

from pathlib import Path


def keep_hypothesis_files_out_of_the_working_directory() -> None:
    """hypothesis keeps files (constants it collects from source) in ``./.hypothesis``:
    a command run in a user's project must not leave them there. They go to onnxfuse's
    cache, or to a temporary directory removed at exit when caching is off."""
    import atexit
    import shutil
    import tempfile

    from hypothesis.configuration import set_hypothesis_home_dir

    from onnxfuse.support.load_cache import cache_dir

    home = cache_dir()
    if home is None:
        home = Path(tempfile.mkdtemp(prefix="onnxfuse-hypothesis-"))
        atexit.register(shutil.rmtree, home, ignore_errors=True)
    set_hypothesis_home_dir(str(home / "hypothesis"))
