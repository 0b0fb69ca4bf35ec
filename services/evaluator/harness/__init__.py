"""What runs inside an evaluator child (`python -m services.evaluator.harness JOB.json`): the
candidate and reference roles, input sets, in-process timing, guards, correctness checks, the
checker the reference's process becomes, and the hand-over of output sets. Nothing here imports
the host side of the evaluator or `sandbox/`.
"""
