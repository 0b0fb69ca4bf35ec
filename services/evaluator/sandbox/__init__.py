"""Confinement of every untrusted child: `isolation` starts and finishes a child (namespaces,
unprivileged user, scrubbed environment, limits), `confine` is what a starting child does to
itself, `forkserver` forks children from a pre-imported harness, `fsview` builds the candidate's
private file view and `memcap` bounds its host memory with a cgroup of its own.
"""
