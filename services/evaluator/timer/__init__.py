"""Record and replay for language `cuda` (DESIGN.md, "What PASSED means" 5): the candidate's
`launch.py` runs only in its sandboxed child, against a recording `kernels` handle (`recorder`);
the launch plan it leaves (`plan`) is replayed by a timer child that imports no candidate Python
(`replay`), inside the harness that times every language."""
