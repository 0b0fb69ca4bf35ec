"""A writer's diagnostic tools, answered by the evaluators (issue 27): `inspect` (what the build of
a `cuda` solution made: ptxas's resource figures, a kernel's SASS; `inspect_build`) and `profile`
(the solution's kernels on one workload under Nsight Compute; `profile`, `ncu`, `target`). Each
is an attempt of its own kind (`AttemptRow.kind`), answered with text in its message and a status
that is never a verdict (`attempt`)."""
