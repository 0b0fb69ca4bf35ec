"""The solutions of the inputs attacks (tests/attacks/test_inputs.py; also a case of tests/hacks):
one that reads every input set file it can reach at import and answers only from that table, and
its honest twin."""

# Every set file it can reach at import: {x's bytes: the right outputs}. Its timed runs look x up.
PRECOMPUTES = """
    import json
    import os
    from pathlib import Path

    import torch

    from services.evaluator.harness import tensorfile

    ANSWERS = {}


    def _places():
        yield Path(json.loads(Path("job.json").read_text())["inputs_dir"])  # the correctness rounds' sets
        attempt = Path.cwd().parent
        yield attempt  # the attempt's folder: any folder hidden in it (where it may list it)
        yield attempt.parent  # the scratch root, as this process's view shows it
        for entry in Path("/proc").iterdir():  # what other processes see, where /proc lets it in
            if entry.name.isdigit():
                yield entry / "cwd" / ".."
                yield entry / "root" / "dev" / "shm"
                yield entry / "root" / "tmp"


    def _set_files(place, limit=5000):
        for top, folders, files in os.walk(place, onerror=lambda error: None):
            for name in files:
                if name.startswith("w") and name.endswith(".st"):
                    yield os.path.join(top, name)
            limit -= 1 + len(files)
            if limit < 0:
                return


    for place in _places():
        for path in _set_files(place):
            try:
                found = tensorfile.load(Path(path))
                ANSWERS[found["x"].numpy().tobytes()] = torch.addcmul(found["b"], found["x"], found["w"])
            except Exception:
                pass


    def run(x, w, b, y):
        answer = ANSWERS.get(x.numpy().tobytes())
        if answer is None or answer.shape != y.shape:
            y.zero_()  # a set it did not read before its run
        else:
            y.copy_(answer)
    """
HONEST = """
    import torch


    def run(x, w, b, y):
        torch.addcmul(b, x, w, out=y)
    """
